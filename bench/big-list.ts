/*
 * The big list: BIG_ROWS categories (1,000,000 by default, about 113 MB of JSON),
 * the one answer the contract lets grow without bound, read by curl (Node's fetch
 * is slower than the service at this size). In one run: the time PostgreSQL takes
 * to hand the rows over (COPY … TO STDOUT), a cold GET (the list built), warm GETs,
 * the first GET after a create, and plain node:http sending the same bytes from a
 * buffer. A liveness probe runs beside every phase in a thread of its own and
 * reports its slowest answer: the longest the instance stopped serving others.
 */
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { performance } from 'node:perf_hooks'
import { Worker } from 'node:worker_threads'
import pg from 'pg'
import { watchPeakRss } from './proc-stats.js'
import { AUTH, copyMs, median, numberFromEnv, runToExit, seedLongRows, startPostgres, startServer, type ServerKind } from './servers.js'

const ROWS = numberFromEnv('BIG_ROWS', 1_000_000)
const ROUNDS = numberFromEnv('BIG_ROUNDS', 5)
// baseline: the build in BENCH_BASELINE_DIR, for before and after on the same machine
const SERVER = (process.env.BIG_SERVER ?? 'service') as ServerKind
const runId = Date.now().toString(36)
const log = (message: string): void => { process.stderr.write(`[big-list ${new Date().toISOString().slice(11, 19)}] ${message}\n`) }

/** Sequential GETs of /health/live from a worker thread; `slowest()` returns the slowest answer since the last call, in ms. */
function startProbe (url: string): { slowest: () => Promise<number>, stop: () => Promise<number> } {
  const worker = new Worker(`
    const http = require('node:http')
    const { parentPort, workerData } = require('node:worker_threads')
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
    let slowest = 0
    let running = true
    const once = () => new Promise((resolve) => {
      const started = performance.now()
      http.get(workerData + '/health/live', { agent }, (res) => { res.resume(); res.on('end', () => resolve(performance.now() - started)) })
        .on('error', () => resolve(performance.now() - started))
    })
    ;(async () => {
      while (running) {
        slowest = Math.max(slowest, await once())
        await new Promise(resolve => setTimeout(resolve, 5))
      }
    })()
    parentPort.on('message', (m) => { parentPort.postMessage(slowest); slowest = 0; if (m === 'stop') { running = false; agent.destroy(); parentPort.close() } })
  `, { eval: true, workerData: url })
  const ask = async (message: string): Promise<number> => await new Promise(resolve => { worker.once('message', resolve); worker.postMessage(message) })
  return { slowest: async () => await ask('reset'), stop: async () => await ask('stop') }
}

/** One GET by curl (the key on its stdin, not its command line), the body dropped or kept; its time to the last byte. */
async function curlGet (url: string, keep = false): Promise<{ ms: number, bytes: number, body?: Buffer }> {
  const curl = spawn('curl', ['-s', '-K', '-', '-o', keep ? '-' : '/dev/null', '-w', keep ? '' : '%{http_code} %{size_download} %{time_total}', url])
  curl.stdin.end(`header = "authorization: ${AUTH.authorization}"\n`)
  const out: Buffer[] = []
  curl.stdout.on('data', (chunk: Buffer) => out.push(chunk))
  const [code] = await once(curl, 'close') as [number]
  if (code !== 0) throw new Error(`curl exited with ${code}`)
  if (keep) return { ms: 0, bytes: 0, body: Buffer.concat(out) }
  const [status, bytes, seconds] = Buffer.concat(out).toString().split(' ')
  if (status !== '200') throw new Error(`GET ${url} answered ${String(status)}`)
  return { ms: Number(seconds) * 1000, bytes: Number(bytes) }
}

/** Plain node:http sending `body` from memory: the socket's pace on this machine. */
async function staticServer (body: Buffer): Promise<{ url: string, close: () => void }> {
  const server = http.createServer((_req, res) => { res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length }).end(body) })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/categories`, close: () => { server.close() } }
}

async function main (): Promise<void> {
  const postgres = await startPostgres()
  log(`PostgreSQL ${postgres.version} (${postgres.source}); ${ROWS} rows`)
  const lines = ['| phase | time | slowest probe |', '|---|---:|---:|']
  const verdicts: string[] = []
  let expectedBytes = 0
  try {
    const databaseUrl = await postgres.createDatabase(`big_${runId}`)
    // BIG_CPU_PROF=<dir>: the service writes a V8 CPU profile there when it stops (bench/cpu-profile.ts reads it).
    const nodeArgs = process.env.BIG_CPU_PROF === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${process.env.BIG_CPU_PROF}`]
    const server = await startServer(SERVER, { databaseUrl, logLevel: 'info', workDir: postgres.workDir, label: 'big-service', nodeArgs })
    const list = `${server.url}/v1/categories`
    let probe: ReturnType<typeof startProbe> | undefined
    try {
      expectedBytes = await seedLongRows(databaseUrl, ROWS)
      probe = startProbe(server.url)
      const rss = watchPeakRss(server.pid)
      const row = async (name: string, run: () => Promise<number>): Promise<number> => {
        await probe?.slowest()
        const ms = await run()
        const stall = await probe?.slowest() ?? 0
        lines.push(`| ${name} | ${ms.toFixed(0)} ms | ${stall.toFixed(0)} ms |`)
        log(`${name}: ${ms.toFixed(0)} ms, probe ${stall.toFixed(0)} ms`)
        stalls.push(stall)
        return ms
      }
      const stalls: number[] = []
      const checked = async (url: string): Promise<number> => {
        const { ms, bytes } = await curlGet(url)
        if (bytes !== expectedBytes) throw new Error(`${url}: ${bytes} bytes, not ${expectedBytes}`)
        return ms
      }
      await row('idle (the probe alone, 2 s)', async () => { await new Promise(resolve => setTimeout(resolve, 2000)); return 2000 })
      const idleStall = stalls.pop() ?? 0
      const copies = [await row('PostgreSQL: COPY (SELECT id, name, description …) TO STDOUT', async () => await copyMs(databaseUrl))]
      const colds = [await row('cold GET (the list built)', async () => await checked(list))]
      const body = (await curlGet(list, true)).body as Buffer
      const plain = await staticServer(body)
      const warm: number[] = []
      const statics: number[] = []
      try {
        for (let round = 0; round < ROUNDS; round++) {
          statics.push(await row('node:http sending the same bytes from memory', async () => await checked(plain.url)))
          warm.push(await row('warm GET', async () => await checked(list)))
        }
      } finally {
        plain.close()
      }
      await row('8 warm GETs at once (all answered)', async () => {
        const started = performance.now()
        await Promise.all(Array.from({ length: 8 }, async () => await checked(list)))
        return performance.now() - started
      })
      const afterCreate: number[] = []
      for (let round = 0; round < 3; round++) {
        const response = await fetch(list, { method: 'POST', headers: { ...AUTH, 'content-type': 'application/json' }, body: `{"name":"one more ${round}"}` })
        await response.arrayBuffer()
        expectedBytes += Buffer.byteLength(`,{"id":${ROWS + round + 1},"name":"one more ${round}"}`)
        afterCreate.push(await row('first GET after a create', async () => await checked(list)))
      }
      const peak = rss.stop()
      // More cold builds for a median (after the peak RSS: each leaves its predecessor to the garbage collector).
      for (let round = 1; round < 3; round++) {
        copies.push(await row('PostgreSQL: COPY (SELECT id, name, description …) TO STDOUT', async () => await copyMs(databaseUrl)))
        // A change the cache cannot apply drops the list: the next GET builds it again.
        await adminQuery(databaseUrl, 'UPDATE categories SET name = name WHERE id = 1')
        await new Promise(resolve => setTimeout(resolve, 200))
        colds.push(await row('cold GET (the list built)', async () => await checked(list)))
      }
      const copy = median(copies)
      const cold = median(colds)
      const plainMs = median(statics)
      lines.push(`| peak RSS | ${(peak / 2 ** 20).toFixed(0)} MB (${(peak / expectedBytes).toFixed(2)} × the body) | |`)
      verdicts.push(
        `first cold GET ${(colds[0] as number).toFixed(0)} ms = ${((colds[0] as number) / (copies[0] as number)).toFixed(2)} × the COPY just before it`,
        `cold GET ${cold.toFixed(0)} ms (median of 3) = ${(cold / copy).toFixed(2)} × COPY ${copy.toFixed(0)} ms (target ≤ 1.5)`,
        `slowest probe answer ${Math.max(...stalls).toFixed(0)} ms (target ≤ 50; ${idleStall.toFixed(0)} ms with the instance idle)`,
        `warm GET ${median(warm).toFixed(0)} ms = ${(median(warm) / plainMs).toFixed(2)} × node:http ${plainMs.toFixed(0)} ms (target ≤ 1.3)`,
        `first GET after a create ${median(afterCreate).toFixed(0)} ms = ${(median(afterCreate) / plainMs).toFixed(2)} × node:http (target ≤ 1.3)`,
        `peak RSS ${(peak / expectedBytes).toFixed(2)} × the body (target ≤ 2.5)`
      )
    } finally {
      await probe?.stop()
      await server.stop()
    }
  } finally {
    await postgres.stop()
  }
  lines.unshift(`Big list: ${ROWS} rows, ${(expectedBytes / 1e6).toFixed(1)} MB of JSON, read by curl; PostgreSQL ${postgres.version}`, '')
  process.stdout.write([...lines, '', ...verdicts.map(v => `- ${v}`)].join('\n') + '\n')
}

async function adminQuery (databaseUrl: string, text: string): Promise<void> {
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  try { await client.query(text) } finally { await client.end() }
}

await runToExit(main)
