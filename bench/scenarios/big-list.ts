// big-list: the one answer the contract lets grow without bound, read by curl in phases (bench/README.md).
import { once } from 'node:events'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { finished } from 'node:stream/promises'
import { Worker } from 'node:worker_threads'
import { to as copyTo } from 'pg-copy-streams'
import { cpuSeconds, peakRssBytes, resetPeakRss } from '../proc-stats.js'
import { type ScenarioGroup, type Verdict, header, mb, ratioText, row, verdict } from '../report.js'
import {
  LIST_PATH, curlBody, curlGet, log, median, numberFromEnv, seedLongRows, send, startServer, withClient
} from '../servers.js'
import { settings } from '../wrk.js'

const ROWS = numberFromEnv('BIG_ROWS', 1_000_000)
const DEFAULT_ROUNDS = 3
const WARM_GETS = 3
const CONCURRENT_GETS = 8
const IDLE_MS = 2000
const PROBE_PAUSE_MS = 5
const READY_WITHIN_MS = 15_000
const FIRST_OVER_WARM = 1.5
const WARM_OVER_STATIC = 1.3
const AFTER_WRITE_OVER_WARM = 1.3
const STALL_MS = 50
const RSS_OVER_BODY = 2.5

const READY = 'start until ready (the list built)'
const READY_CPU = 'service CPU until ready'
const FIRST = 'first GET after ready'
const IDLE = 'idle (the probe alone)'
const COPY = 'PostgreSQL: COPY … TO STDOUT'
const STATIC = 'node:http sending the same bytes'
const WARM = 'warm GET'
const CONCURRENT = `${CONCURRENT_GETS} warm GETs at once`
const AFTER_CREATE = 'first GET after a create'
const AFTER_UPDATE = 'first GET after an update'
const AFTER_DELETE = 'first GET after a delete'
const AFTER = [AFTER_CREATE, AFTER_UPDATE, AFTER_DELETE]
const PHASES = [READY, READY_CPU, FIRST, IDLE, COPY, STATIC, WARM, CONCURRENT, ...AFTER]

/** Sequential GETs of /health/live from a worker thread; slowest() answers the slowest since its last call, in ms. */
function startProbe (url: string): { slowest: () => number, stop: () => Promise<number> } {
  const slowest = new Int32Array(new SharedArrayBuffer(Int32Array.BYTES_PER_ELEMENT))
  const worker = new Worker(`
    const http = require('node:http')
    const { workerData: { url, pauseMs, slowest } } = require('node:worker_threads')
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
    const probe = () => {
      const started = performance.now()
      const done = () => {
        Atomics.store(slowest, 0, Math.max(Atomics.load(slowest, 0), Math.ceil(performance.now() - started)))
        setTimeout(probe, pauseMs)
      }
      http.get(url + '/health/live', { agent }, res => res.resume().on('end', done)).on('error', done)
    }
    probe()
  `, { eval: true, workerData: { url, pauseMs: PROBE_PAUSE_MS, slowest } })
  return { slowest: () => Atomics.exchange(slowest, 0, 0), stop: async () => await worker.terminate() }
}

/** Plain node:http sending `body` from memory: the socket's own pace on this machine. */
async function staticServer (body: Buffer): Promise<http.Server> {
  const server = http.createServer((_request, response) => {
    response.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length }).end(body)
  })
  await once(server.listen(0, '127.0.0.1'), 'listening')
  return server
}

/** PostgreSQL's own pace: `COPY … TO STDOUT` of the categories, read and dropped; milliseconds. */
async function copyMs (databaseUrl: string): Promise<number> {
  return await withClient(databaseUrl, async client => {
    const started = performance.now()
    const stream = client.query(copyTo('COPY (SELECT id, name, description FROM categories ORDER BY id) TO STDOUT'))
    await finished(stream.resume())
    return performance.now() - started
  })
}

async function getChecked (url: string, bytes: number): Promise<number> {
  const transfer = await curlGet(url)
  if (transfer.status !== 200 || transfer.bytes !== bytes) {
    throw new Error(`GET ${url}: ${transfer.status}, ${transfer.bytes} bytes, not ${bytes}`)
  }
  return transfer.totalMs
}

type Round = Map<string, Array<{ ms: number, stall: number }>>

const msOf = (round: Round, phase: string): number => median(round.get(phase)?.map(t => t.ms) ?? [])
const stallOf = (round: Round, phase: string): number => Math.max(0, ...(round.get(phase)?.map(t => t.stall) ?? []))

async function oneRound (databaseUrl: string, round: number):
Promise<{ timings: Round, peakRss: number, bodyBytes: number }> {
  const starting = performance.now()
  const server = await startServer('service', databaseUrl, { label: `big-list-${round}` })
  const timings: Round = new Map([
    [READY, [{ ms: performance.now() - starting, stall: 0 }]],
    [READY_CPU, [{ ms: cpuSeconds(server.pid) * 1000, stall: 0 }]]
  ])
  resetPeakRss(server.pid)
  const probe = startProbe(server.url)
  const list = `${server.url}${LIST_PATH}`
  const timed = async (phase: string, run: () => Promise<number>): Promise<void> => {
    probe.slowest()
    const ms = await run()
    const stall = probe.slowest()
    timings.set(phase, [...(timings.get(phase) ?? []), { ms, stall }])
    log(`big list round ${round}, ${phase}: ${ms.toFixed(0)} ms, probe ${stall.toFixed(0)} ms`)
  }
  let plain: http.Server | undefined
  try {
    const fresh = async (): Promise<number> => (await curlGet(list)).totalMs
    // To /dev/null like every timed GET; the bytes for node:http are fetched after, untimed (a file costs the disk).
    await timed(FIRST, fresh)
    const body = await curlBody(list)
    await timed(IDLE, async () => await new Promise(resolve => setTimeout(() => resolve(IDLE_MS), IDLE_MS)))
    await timed(COPY, async () => await copyMs(databaseUrl))
    plain = await staticServer(body)
    const plainUrl = `http://127.0.0.1:${(plain.address() as AddressInfo).port}${LIST_PATH}`
    for (let i = 0; i < WARM_GETS; i++) {
      await timed(STATIC, async () => await getChecked(plainUrl, body.length))
      await timed(WARM, async () => await getChecked(list, body.length))
    }
    await timed(CONCURRENT, async () => {
      const started = performance.now()
      await Promise.all(Array.from({ length: CONCURRENT_GETS }, async () => await getChecked(list, body.length)))
      return performance.now() - started
    })
    // As many of each as warm GETs: a round compares a median with a median, not one GET with three.
    for (let i = 0; i < WARM_GETS; i++) {
      // Ids are never reused: each delete of each round has an id of its own, which no earlier one touched.
      const id = (round - 1) * WARM_GETS + i + 1
      await send(list, 'POST', { name: `big list round ${round}, ${i}` })
      await timed(AFTER_CREATE, fresh)
      await send(`${list}/${Math.ceil(ROWS / 2) + id}`, 'PATCH', { name: `renamed in round ${round}` })
      await timed(AFTER_UPDATE, fresh)
      await send(`${list}/${id}`, 'DELETE')
      await timed(AFTER_DELETE, fresh)
    }
    return { timings, peakRss: peakRssBytes(server.pid), bodyBytes: body.length }
  } finally {
    plain?.close()
    await probe.stop()
    await server.stop()
  }
}

function verdicts (rounds: Round[], peakRss: number, bodyBytes: number): Verdict[] {
  const scenario = `big list, ${ROWS.toLocaleString('en')} rows`
  const check = (target: string, measured: string, met: boolean): Verdict => verdict(scenario, target, measured, met)
  const overall = (phase: string): number => median(rounds.map(round => msOf(round, phase)))
  const overWarm = (phase: string, max: number): Verdict => {
    const ratios = rounds.map(round => msOf(round, phase) / msOf(round, WARM))
    return check(`${phase} ≤ ${max} × the warm GET, every round`, ratios.map(r => ratioText(r)).join(', '),
      ratios.every(r => r <= max))
  }
  const slowest = (phases: string[]): number => Math.max(...rounds.flatMap(round => phases.map(p => stallOf(round, p))))
  const ready = Math.max(...rounds.map(round => msOf(round, READY)))
  const buildOverCopy = ratioText(overall(READY_CPU) / overall(COPY))
  const warmOverStatic = overall(WARM) / overall(STATIC)
  const staticMet = warmOverStatic <= WARM_OVER_STATIC
  const afterWrite = slowest(AFTER)
  const any = slowest([FIRST, COPY, STATIC, WARM, CONCURRENT, ...AFTER])
  const rss = peakRss / bodyBytes
  return [
    check(`ready within ${READY_WITHIN_MS / 1000} s of the start, every round`,
      `${(ready / 1000).toFixed(1)} s (the build ${buildOverCopy} × COPY in CPU)`, ready <= READY_WITHIN_MS),
    overWarm(FIRST, FIRST_OVER_WARM),
    check(`warm GET ≤ ${WARM_OVER_STATIC} × node:http`, ratioText(warmOverStatic), staticMet),
    ...AFTER.map(phase => overWarm(phase, AFTER_WRITE_OVER_WARM)),
    check(`no probe answer over ${STALL_MS} ms after a write`, `${afterWrite.toFixed(0)} ms`, afterWrite <= STALL_MS),
    check(`no probe answer over ${STALL_MS} ms in any phase`,
      `${any.toFixed(0)} ms (idle ${slowest([IDLE]).toFixed(0)} ms)`, any <= STALL_MS),
    check(`peak RSS ≤ ${RSS_OVER_BODY} × the body`, `${ratioText(rss)} (${mb(peakRss)} MB)`, rss <= RSS_OVER_BODY)
  ]
}

export const bigList: ScenarioGroup = {
  ids: ['big-list'],
  run: async (postgres) => {
    const databaseUrl = await postgres.createDatabase('big')
    await seedLongRows(databaseUrl, ROWS)
    const done: Round[] = []
    let peakRss = 0
    let bodyBytes = 0
    for (let round = 1; round <= settings({ rounds: DEFAULT_ROUNDS }).rounds; round++) {
      const result = await oneRound(databaseUrl, round)
      done.push(result.timings)
      peakRss = Math.max(peakRss, result.peakRss)
      bodyBytes = result.bodyBytes
    }
    const cell = (round: Round, phase: string): string => {
      const ms = `${msOf(round, phase).toFixed(0)} ms`
      return phase === READY || phase === READY_CPU ? ms : `${ms} (${stallOf(round, phase).toFixed(0)})`
    }
    const lines = [
      `${ROWS.toLocaleString('en')} rows, ${(bodyBytes / 1e6).toFixed(1)} MB of JSON, read by curl; each round a new ` +
        'service process. Milliseconds, medians of a round\'s GETs; in brackets the probe\'s slowest answer.',
      '',
      ...header(['phase', ...done.map((_, i) => `round ${i + 1}`)]),
      ...PHASES.map(phase => row([phase, ...done.map(round => cell(round, phase))]))
    ]
    return { title: 'Big list', lines, verdicts: verdicts(done, peakRss, bodyBytes) }
  }
}
