/*
 * The big list: BIG_ROWS categories (1,000,000 by default, about 110 MB of JSON),
 * the one answer the contract lets grow without bound. For the service as
 * deployed and the naive peer, on one PostgreSQL: the time PostgreSQL itself
 * takes to hand the rows over (COPY … TO STDOUT), a cold GET (the list built),
 * warm GETs one at a time and eight at once, and the first GET after a create.
 * A liveness probe runs beside every phase in a thread of its own (so reading
 * the big bodies here cannot delay it) and reports its slowest answer: the
 * longest the instance stopped serving its other requests.
 */
import http from 'node:http'
import { performance } from 'node:perf_hooks'
import { finished } from 'node:stream/promises'
import { Worker } from 'node:worker_threads'
import pg from 'pg'
import { to as copyTo } from 'pg-copy-streams'
import { watchPeakRss } from './proc-stats.js'
import { AUTH, numberFromEnv, runToExit, seedLongRows, startPostgres, startServer, type RunningServer } from './servers.js'

const ROWS = numberFromEnv('BIG_ROWS', 1_000_000)
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

/** One GET of the list (in `encoding`, when given), the body counted and thrown away; its time to the last byte in ms. */
async function getList (url: string, encoding?: string): Promise<{ ms: number, bytes: number }> {
  const started = performance.now()
  return await new Promise((resolve, reject) => {
    http.get(`${url}/v1/categories`, { headers: { ...AUTH, ...(encoding === undefined ? {} : { 'accept-encoding': encoding }) } }, (res) => {
      let bytes = 0
      res.on('data', (chunk: Buffer) => { bytes += chunk.length })
      res.on('end', () => {
        if (res.statusCode !== 200) reject(new Error(`GET answered ${res.statusCode}`))
        else if (res.headers['content-encoding'] !== encoding) reject(new Error(`GET for ${String(encoding)} answered in ${String(res.headers['content-encoding'])}`))
        else resolve({ ms: performance.now() - started, bytes })
      })
    }).on('error', reject)
  })
}

async function copyMs (databaseUrl: string): Promise<number> {
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  try {
    await client.query('SET statement_timeout = 0')
    const started = performance.now()
    const stream = client.query(copyTo('COPY (SELECT id, name, description FROM categories ORDER BY id) TO STDOUT'))
    // PostgreSQL's own speed of handing the rows over: read and dropped.
    stream.resume()
    await finished(stream)
    return performance.now() - started
  } finally {
    await client.end()
  }
}

const median = (values: number[]): number => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] as number

interface Phase { name: string, ms: number, stallMs?: number }

async function measure (server: RunningServer, expectedBytes: number, service: boolean): Promise<Phase[]> {
  const probe = startProbe(server.url)
  const phases: Phase[] = []
  const phase = async (name: string, run: () => Promise<number>): Promise<void> => {
    await probe.slowest()
    const ms = await run()
    phases.push({ name, ms, stallMs: await probe.slowest() })
    log(`${server.kind}: ${name}: ${ms.toFixed(0)} ms`)
  }
  const checked = async (): Promise<number> => {
    const { ms, bytes } = await getList(server.url)
    if (bytes !== expectedBytes) throw new Error(`${server.kind}: the list has ${bytes} bytes, not ${expectedBytes}`)
    return ms
  }
  try {
    // The probe's own answer time on this machine when the instance does nothing else.
    await phase('idle (the probe alone, 2 s)', async () => { await new Promise(resolve => setTimeout(resolve, 2000)); return 2000 })
    await phase('cold GET (the list built)', checked)
    const warm: number[] = []
    await phase('warm GET (median of 5)', async () => {
      for (let i = 0; i < 5; i++) warm.push(await checked())
      return median(warm)
    })
    await phase('8 warm GETs at once (all answered)', async () => {
      const started = performance.now()
      await Promise.all(Array.from({ length: 8 }, checked))
      return performance.now() - started
    })
    if (service) {
      await phase('first GET after a create', async () => {
        const response = await fetch(`${server.url}/v1/categories`, { method: 'POST', headers: { ...AUTH, 'content-type': 'application/json' }, body: '{"name":"one more"}' })
        await response.arrayBuffer()
        const { ms } = await getList(server.url)
        return ms
      })
      // Compressing (bench/compression.ts has the bytes and a slow link): once per version and coding, in zlib's threadpool.
      for (const encoding of ['gzip', 'br']) await phase(`first ${encoding} GET (the list compressed)`, async () => (await getList(server.url, encoding)).ms)
      await phase('a create, then 4 gzip and 4 br GETs at once (compressed once per coding)', async () => {
        const response = await fetch(`${server.url}/v1/categories`, { method: 'POST', headers: { ...AUTH, 'content-type': 'application/json' }, body: '{"name":"and one more"}' })
        await response.arrayBuffer()
        const started = performance.now()
        await Promise.all(['gzip', 'br'].flatMap(encoding => Array.from({ length: 4 }, async () => await getList(server.url, encoding))))
        return performance.now() - started
      })
    }
  } finally {
    await probe.stop()
  }
  return phases
}

async function main (): Promise<void> {
  const postgres = await startPostgres()
  log(`PostgreSQL ${postgres.version} (${postgres.source}); ${ROWS} rows`)
  const lines = ['| system | phase | time | stall |', '|---|---|---:|---:|']
  let expectedBytes = 0
  const verdicts: string[] = []
  try {
    for (const kind of ['service', 'naive'] as const) {
      const databaseUrl = await postgres.createDatabase(`big_${runId}_${kind}`)
      const server = await startServer(kind, { databaseUrl, logLevel: 'info', workDir: postgres.workDir, label: `big-${kind}` })
      try {
        expectedBytes = await seedLongRows(databaseUrl, ROWS)
        const copies = [await copyMs(databaseUrl), await copyMs(databaseUrl), await copyMs(databaseUrl)]
        const copy = median(copies)
        lines.push(`| ${kind} | PostgreSQL: COPY (SELECT …) TO STDOUT (median of 3) | ${copy.toFixed(0)} ms | |`)
        const rss = watchPeakRss(server.pid)
        const phases = await measure(server, expectedBytes, kind === 'service')
        const peak = rss.stop()
        for (const p of phases) lines.push(`| ${kind} | ${p.name} | ${p.ms.toFixed(0)} ms | ${p.stallMs === undefined ? '' : `${p.stallMs.toFixed(0)} ms`} |`)
        lines.push(`| ${kind} | peak RSS | ${(peak / 2 ** 20).toFixed(0)} MB (${(peak / expectedBytes).toFixed(2)} × the body) | |`)
        if (kind === 'service') {
          const stall = Math.max(...phases.filter(p => !p.name.startsWith('idle')).map(p => p.stallMs ?? 0))
          const byName = (prefix: string): number => phases.find(p => p.name.startsWith(prefix))?.ms ?? Number.NaN
          verdicts.push(
            `slowest probe answer ${stall.toFixed(0)} ms (target ≤ 50)`,
            `peak RSS ${(peak / expectedBytes).toFixed(2)} × the body (target ≤ 2.5)`,
            `warm GET ${byName('warm').toFixed(0)} ms (target ≤ 100)`,
            `cold GET ${(byName('cold') / copy).toFixed(2)} × COPY (target ≤ 1.5)`
          )
        }
      } finally {
        await server.stop()
      }
    }
  } finally {
    await postgres.stop()
  }
  lines.unshift(`Big list: ${ROWS} rows, ${(expectedBytes / 1e6).toFixed(1)} MB of JSON; PostgreSQL ${postgres.version}; stall = the slowest /health/live answer during the phase`, '')
  process.stdout.write([...lines, '', ...verdicts.map(v => `- ${v}`)].join('\n') + '\n')
}

await runToExit(main)
