/*
 * big-list: BIG_ROWS categories (1,000,000, about 141.7 MB of JSON), the one answer the contract lets grow without
 * bound, read by curl. Each round starts the service afresh on the same table and times PostgreSQL's own COPY, the
 * start until ready (a warm start: the list is built first) and the service's CPU for it, the first GET after ready,
 * warm GETs beside plain node:http sending the same bytes, eight warm GETs at once, and the first GET after a create,
 * an update and a delete against the warm GET. A liveness probe runs in a thread of its own beside every phase from
 * ready on: its slowest answer is the longest the instance stalled.
 */
import { once } from 'node:events'
import { readFile } from 'node:fs/promises'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import path from 'node:path'
import { Worker } from 'node:worker_threads'
import { cpuSeconds, watchPeakRss } from '../proc-stats.js'
import { type ScenarioGroup, type Verdict, mb, ratioText, settings } from '../report.js'
import {
  AUTH, LIST_PATH, copyMs, curlGet, log, median, numberFromEnv, seedLongRows, startServer
} from '../servers.js'

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

/** Sequential GETs of /health/live from a worker thread; slowest() is the slowest answer since the last call, in ms. */
function startProbe (url: string): { slowest: () => Promise<number>, stop: () => Promise<number> } {
  const worker = new Worker(`
    const http = require('node:http')
    const { parentPort, workerData } = require('node:worker_threads')
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
    let slowest = 0
    let running = true
    const probe = () => new Promise(resolve => {
      const started = performance.now()
      const done = () => resolve(performance.now() - started)
      const request = http.get(workerData.url + '/health/live', { agent }, res => {
        res.resume()
        res.on('end', done)
      })
      request.on('error', done)
    })
    const loop = async () => {
      while (running) {
        slowest = Math.max(slowest, await probe())
        await new Promise(resolve => setTimeout(resolve, workerData.pauseMs))
      }
    }
    loop()
    parentPort.on('message', message => {
      parentPort.postMessage(slowest)
      slowest = 0
      if (message !== 'stop') return
      running = false
      agent.destroy()
      parentPort.close()
    })
  `, { eval: true, workerData: { url, pauseMs: PROBE_PAUSE_MS } })
  const ask = async (message: string): Promise<number> => await new Promise(resolve => {
    worker.once('message', resolve)
    worker.postMessage(message)
  })
  return { slowest: async () => await ask('reset'), stop: async () => await ask('stop') }
}

/** Plain node:http sending `body` from memory: the socket's own pace on this machine. */
async function staticServer (body: Buffer): Promise<{ url: string, close: () => void }> {
  const server = http.createServer((_request, response) => {
    response.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length }).end(body)
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  const { port } = server.address() as AddressInfo
  return { url: `http://127.0.0.1:${port}${LIST_PATH}`, close: () => { server.close() } }
}

const IDLE = 'idle (the probe alone)'
const COPY = 'PostgreSQL: COPY … TO STDOUT'
const READY = 'start until ready (the list built)'
const READY_CPU = 'service CPU until ready'
const FIRST = 'first GET after ready'
const STATIC = 'node:http sending the same bytes'
const WARM = 'warm GET'
const CONCURRENT = `${CONCURRENT_GETS} warm GETs at once`
const AFTER = {
  create: 'first GET after a create',
  update: 'first GET after an update',
  delete: 'first GET after a delete'
}

/** Each phase's times in one round, in ms, with the probe's slowest answer during each. */
type Round = Map<string, Array<{ ms: number, stall: number }>>

const msOf = (round: Round, phase: string): number => median(round.get(phase)?.map(t => t.ms) ?? [])
const stallOf = (round: Round, phase: string): number => Math.max(0, ...(round.get(phase)?.map(t => t.stall) ?? []))

async function write (url: string, method: string, body?: object): Promise<void> {
  const contentType = method === 'PATCH' ? 'application/merge-patch+json' : 'application/json'
  const headers = body === undefined ? AUTH : { ...AUTH, 'content-type': contentType }
  const text = body === undefined ? undefined : JSON.stringify(body)
  const response = await fetch(url, { method, headers, body: text })
  await response.arrayBuffer()
  if (response.status >= 300) throw new Error(`${method} ${url} answered ${response.status}`)
}

async function getChecked (url: string, bytes: number): Promise<number> {
  const transfer = await curlGet(url)
  if (transfer.status !== 200 || transfer.bytes !== bytes) {
    throw new Error(`GET ${url}: ${transfer.status}, ${transfer.bytes} bytes, not ${bytes}`)
  }
  return transfer.totalMs
}

interface RoundResult { timings: Round, peakRss: number, bodyBytes: number }

async function oneRound (databaseUrl: string, workDir: string, round: number, seededBytes: number):
Promise<RoundResult> {
  const starting = performance.now()
  const server = await startServer('service', { label: `big-list-${round}`, workDir, databaseUrl })
  const readyMs = performance.now() - starting
  const readyCpuMs = cpuSeconds(server.pid) * 1000
  const probe = startProbe(server.url)
  const rss = watchPeakRss(server.pid)
  const timings: Round = new Map()
  const list = `${server.url}${LIST_PATH}`
  const timed = async (phase: string, run: () => Promise<number>): Promise<void> => {
    await probe.slowest()
    const ms = await run()
    const stall = await probe.slowest()
    timings.set(phase, [...(timings.get(phase) ?? []), { ms, stall }])
    log(`big list round ${round}, ${phase}: ${ms.toFixed(0)} ms, probe ${stall.toFixed(0)} ms`)
  }
  let plain: { url: string, close: () => void } | undefined
  timings.set(READY, [{ ms: readyMs, stall: 0 }])
  timings.set(READY_CPU, [{ ms: readyCpuMs, stall: 0 }])
  try {
    // To /dev/null like every timed GET; the bytes for node:http are fetched after, untimed (a file costs the disk).
    await timed(FIRST, async () => (await curlGet(list)).totalMs)
    const bodyFile = path.join(workDir, 'big-list.json')
    await curlGet(list, {}, bodyFile)
    await timed(IDLE, async () => {
      await new Promise(resolve => setTimeout(resolve, IDLE_MS))
      return IDLE_MS
    })
    await timed(COPY, async () => await copyMs(databaseUrl))
    const body = await readFile(bodyFile)
    // Later rounds meet the rows the rounds before them wrote.
    if (round === 1 && body.length !== seededBytes) throw new Error(`the list was ${body.length} bytes`)
    const local = await staticServer(body)
    plain = local
    for (let i = 0; i < WARM_GETS; i++) {
      await timed(STATIC, async () => await getChecked(local.url, body.length))
      await timed(WARM, async () => await getChecked(list, body.length))
    }
    await timed(CONCURRENT, async () => {
      const started = performance.now()
      await Promise.all(Array.from({ length: CONCURRENT_GETS }, async () => await getChecked(list, body.length)))
      return performance.now() - started
    })
    const fresh = async (): Promise<number> => (await curlGet(list)).totalMs
    await write(list, 'POST', { name: `big list round ${round}` })
    await timed(AFTER.create, fresh)
    await write(`${list}/${Math.ceil(ROWS / 2) + round}`, 'PATCH', { name: `renamed in round ${round}` })
    await timed(AFTER.update, fresh)
    // Ids are never reused: round r deletes id r, which no earlier round touched.
    await write(`${list}/${round}`, 'DELETE')
    await timed(AFTER.delete, fresh)
    return { timings, peakRss: rss.stop(), bodyBytes: body.length }
  } finally {
    plain?.close()
    await probe.stop()
    await server.stop()
  }
}

function verdicts (rounds: Round[], peakRss: number, bodyBytes: number): Verdict[] {
  const scenario = `big list, ${ROWS.toLocaleString('en')} rows`
  const verdict = (target: string, measured: string, met: boolean): Verdict => ({ scenario, target, measured, met })
  const overall = (phase: string): number => median(rounds.map(round => msOf(round, phase)))
  const ready = Math.max(...rounds.map(round => msOf(round, READY)))
  const firstOverWarm = rounds.map(round => msOf(round, FIRST) / msOf(round, WARM))
  const warmOverStatic = overall(WARM) / overall(STATIC)
  const afterWrites = Object.values(AFTER).map(phase => {
    const ratios = rounds.map(round => msOf(round, phase) / msOf(round, WARM))
    const target = `${phase} ≤ ${AFTER_WRITE_OVER_WARM} × the warm GET, every round`
    return verdict(target, ratios.map(r => ratioText(r)).join(', '), ratios.every(r => r <= AFTER_WRITE_OVER_WARM))
  })
  const slowest = (phases: string[]): number => Math.max(...rounds.flatMap(round => phases.map(p => stallOf(round, p))))
  const afterWrite = slowest(Object.values(AFTER))
  const any = slowest([FIRST, COPY, STATIC, WARM, CONCURRENT, ...Object.values(AFTER)])
  const stall = `no probe answer over ${STALL_MS} ms`
  const rss = peakRss / bodyBytes
  return [
    verdict(`ready within ${READY_WITHIN_MS / 1000} s of the start, every round`, `${(ready / 1000).toFixed(1)} s ` +
      `(the build ${ratioText(overall(READY_CPU) / overall(COPY))} × COPY in CPU)`, ready <= READY_WITHIN_MS),
    verdict(`first GET after ready ≤ ${FIRST_OVER_WARM} × the warm GET, every round`,
      firstOverWarm.map(r => ratioText(r)).join(', '), firstOverWarm.every(r => r <= FIRST_OVER_WARM)),
    verdict(`warm GET ≤ ${WARM_OVER_STATIC} × node:http`, ratioText(warmOverStatic),
      warmOverStatic <= WARM_OVER_STATIC),
    ...afterWrites,
    verdict(`${stall} after a write`, `${afterWrite.toFixed(0)} ms`, afterWrite <= STALL_MS),
    verdict(`${stall} in any phase`, `${any.toFixed(0)} ms (idle ${slowest([IDLE]).toFixed(0)} ms)`, any <= STALL_MS),
    verdict(`peak RSS ≤ ${RSS_OVER_BODY} × the body`, `${ratioText(rss)} (${mb(peakRss)} MB)`, rss <= RSS_OVER_BODY)
  ]
}

export const bigList: ScenarioGroup = {
  ids: ['big-list'],
  byDefault: false,
  run: async ({ postgres, runId }) => {
    const { rounds } = settings({ rounds: DEFAULT_ROUNDS })
    const databaseUrl = await postgres.createDatabase(`big_${runId}`)
    // Started once to migrate the table it then reads in every round.
    const migrated = await startServer('service', { label: 'big-list-migrate', workDir: postgres.workDir, databaseUrl })
    await migrated.stop()
    const seededBytes = await seedLongRows(databaseUrl, ROWS)
    const done: Round[] = []
    let peakRss = 0
    let bodyBytes = seededBytes
    for (let round = 1; round <= rounds; round++) {
      const result = await oneRound(databaseUrl, postgres.workDir, round, seededBytes)
      done.push(result.timings)
      peakRss = Math.max(peakRss, result.peakRss)
      bodyBytes = result.bodyBytes
    }
    const phases = [READY, READY_CPU, FIRST, IDLE, COPY, STATIC, WARM, CONCURRENT, ...Object.values(AFTER)]
    const cell = (round: Round, phase: string): string => {
      const ms = `${msOf(round, phase).toFixed(0)} ms`
      return phase === READY || phase === READY_CPU ? ms : `${ms} (${stallOf(round, phase).toFixed(0)})`
    }
    const lines = [
      `${ROWS.toLocaleString('en')} rows, ${(bodyBytes / 1e6).toFixed(1)} MB of JSON, read by curl; each round a new ` +
        'service process. Milliseconds, medians of a round\'s GETs; in brackets the probe\'s slowest answer.',
      '',
      `| phase | ${done.map((_, i) => `round ${i + 1}`).join(' | ')} |`,
      `|---|${done.map(() => '---:').join('|')}|`,
      ...phases.map(phase => `| ${phase} | ${done.map(round => cell(round, phase)).join(' | ')} |`)
    ]
    return [{ title: 'Big list', lines, verdicts: verdicts(done, peakRss, bodyBytes) }]
  }
}
