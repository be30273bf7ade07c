/*
 * npm run bench: the service, the raw Node limit, the Fastify ceiling and the
 * database-backed peers (naive Fastify + pg, Express + pg, Hono + postgres.js,
 * Elysia + Bun.SQL), measured side by side in one run on loopback. See bench/README.md.
 *
 * Two phases, each on fresh databases and fresh server processes, one server at
 * a time: 100 rows (GET list, GET with If-None-Match, mixed 95/5), then 10,000
 * rows (GET list, POST). Rows are created through the API. Every round of a
 * scenario starts from the phase's table: the rows a round created are deleted
 * before the next one.
 */
import { writeFileSync } from 'node:fs'
import { mkdir, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import pg from 'pg'
import { cpuSeconds, machineBusyCpuSeconds, postgresCpuSeconds, watchPeakRss } from './proc-stats.js'
import { buildSource, consoleSummary, markdownReport, ratiosSvg, type RunInfo } from './report.js'
import { SCENARIOS, type Measurement, type Scenario } from './scenarios.js'
import {
  AUTH, IN_MEMORY, ROOT, bunVersion, ensurePeers, numberFromEnv, runToExit, seedRows, seedThroughApi, startLoadGenerator, startPostgres, startServer,
  type LoadGenerator, type Postgres, type RunningServer, type ServerKind
} from './servers.js'

const settings = {
  durationS: numberFromEnv('BENCH_DURATION', 10),
  warmupS: numberFromEnv('BENCH_WARMUP', 3),
  /** Interleaved rounds per scenario; each server's median round is reported. */
  rounds: Math.max(1, Math.round(numberFromEnv('BENCH_ROUNDS', 1))),
  connections: numberFromEnv('BENCH_CONNECTIONS', 50),
  logLevel: process.env.BENCH_LOG_LEVEL ?? 'info',
  outDir: process.env.BENCH_OUT ?? path.join(ROOT, 'bench'),
  /** A comma-separated subset of scenario ids (get100,etag,mixed,get10k,post), for quick checks; all by default. */
  only: (process.env.BENCH_SCENARIOS ?? '').split(',').filter(id => id !== ''),
  /** A comma-separated subset of servers (raw,floor,ceiling,naive,express,hono,bun,baseline,service), for quick checks; all by default. */
  servers: (process.env.BENCH_SERVERS ?? '').split(',').filter(id => id !== '')
}

const SERVER_ORDER: ServerKind[] = ['raw', 'floor', 'ceiling', 'naive', 'express', 'hono', 'bun', ...(process.env.BENCH_BASELINE_DIR === undefined ? [] : ['baseline' as const]), 'service']
const runId = Date.now().toString(36)

function log (message: string): void {
  process.stderr.write(`[bench] ${message}\n`)
}

async function measure (scenario: Scenario, server: RunningServer, load: LoadGenerator, postgres: Postgres, headers: Record<string, string>): Promise<Measurement> {
  let rss: ReturnType<typeof watchPeakRss> | undefined
  let start = { at: 0, server: 0, db: 0, machine: 0 }
  const result = await load.run({
    url: server.url,
    kind: scenario.kind,
    path: '/v1/categories',
    headers,
    connections: settings.connections,
    durationS: settings.durationS,
    warmupS: settings.warmupS,
    rate: 0,
    postEvery: 20,
    namePrefix: `bench-${runId}-${server.kind}-${scenario.id}`
  }, () => {
    rss = watchPeakRss(server.pid)
    start = { at: performance.now(), server: cpuSeconds(server.pid), db: postgresCpuSeconds(postgres.postmasterPid), machine: machineBusyCpuSeconds() }
  })
  const peakRssBytes = rss?.stop() ?? 0
  const elapsedS = (performance.now() - start.at) / 1000
  // Never below zero: a process that exits during the window takes its CPU time with it.
  const percent = (now: number, then: number): number => Math.max(0, Math.round((now - then) / elapsedS * 100))
  const serverCpu = percent(cpuSeconds(server.pid), start.server)
  const dbCpu = IN_MEMORY.includes(server.kind) ? 0 : percent(postgresCpuSeconds(postgres.postmasterPid), start.db)
  const loadCpu = Math.round(result.cpuSeconds / elapsedS * 100)
  const otherCpu = Math.max(0, percent(machineBusyCpuSeconds(), start.machine) - serverCpu - dbCpu - loadCpu)
  let badResponses = 0
  // wrk reports `1xx-3xx` and `4xx-5xx`; autocannon every status.
  for (const [code, count] of Object.entries(result.statusCounts)) {
    if (code === '4xx-5xx' || (code !== '1xx-3xx' && !scenario.ok(Number(code)))) badResponses += count
  }
  return {
    server: server.kind,
    scenario: scenario.id,
    rps: result.rps,
    p50: result.p50,
    p99: result.p99,
    total: result.total,
    socketErrors: result.socketErrors,
    badResponses,
    statusCounts: result.statusCounts,
    bytesPerResponse: result.bytesPerResponse,
    peakRssBytes,
    serverCpu,
    rpsPerCore: serverCpu === 0 ? 0 : result.rps / (serverCpu / 100),
    dbCpu,
    loadCpu,
    otherCpu
  }
}

async function listBody (url: string, extra: Record<string, string> = {}): Promise<{ status: number, body: string, etag: string | null }> {
  // Without Accept-Encoding, as wrk asks: fetch's own would get the compressed list and its tag.
  const response = await fetch(`${url}/v1/categories`, { headers: { ...AUTH, 'accept-encoding': 'identity', ...extra } })
  return { status: response.status, body: await response.text(), etag: response.headers.get('etag') }
}

/**
 * Deletes the rows a writing round added (ids above the seeded ones; the seed
 * holds ids 1..rows) and vacuums, so the next round meets the table the scenario
 * defines instead of one grown by every round before it. Returns how many rows
 * the round had added.
 */
async function restoreTable (databaseUrl: string, rows: number): Promise<number> {
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  try {
    const { rowCount } = await client.query('DELETE FROM categories WHERE id > $1', [rows])
    await client.query('VACUUM categories')
    return rowCount ?? 0
  } finally {
    await client.end()
  }
}

function middle (values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.floor((sorted.length - 1) / 2)] ?? 0
}

/** Of several rounds, the one with the median throughput; RSS is the peak and failures the sum over all of them. */
function combineRounds (rounds: Measurement[]): Measurement {
  const sorted = [...rounds].sort((a, b) => a.rps - b.rps)
  const median = sorted[Math.floor((sorted.length - 1) / 2)] as Measurement
  const statusCounts: Record<string, number> = {}
  for (const r of rounds) for (const [code, count] of Object.entries(r.statusCounts)) statusCounts[code] = (statusCounts[code] ?? 0) + count
  return {
    ...median,
    total: rounds.reduce((sum, r) => sum + r.total, 0),
    socketErrors: rounds.reduce((sum, r) => sum + r.socketErrors, 0),
    badResponses: rounds.reduce((sum, r) => sum + r.badResponses, 0),
    statusCounts,
    peakRssBytes: Math.max(...rounds.map(r => r.peakRssBytes)),
    rpsPerCore: middle(rounds.map(r => r.rpsPerCore)),
    rounds: rounds.map(r => Math.round(r.rps))
  }
}

async function checkSeeded (server: RunningServer, expectedBody: string, notes: string[]): Promise<void> {
  const list = await listBody(server.url)
  // Same rows, same bytes: ids 1..n in every server (concurrent seeding may pair ids and names differently, never the length).
  if (list.status !== 200 || Buffer.byteLength(list.body) !== Buffer.byteLength(expectedBody)) {
    notes.push(`${server.kind}: the list after seeding was not the expected one (status ${list.status}, ${Buffer.byteLength(list.body)} bytes, expected ${Buffer.byteLength(expectedBody)})`)
  }
}

/**
 * One phase: every server it needs started on its own fresh database and
 * seeded, then each scenario measured server after server (only one under load
 * at a time), in BENCH_ROUNDS interleaved rounds whose server order rotates, so
 * that a change in background load hits all of them alike.
 */
async function runPhase (rows: number, postgres: Postgres, load: LoadGenerator, results: Measurement[], notes: string[]): Promise<void> {
  const scenarios = SCENARIOS.filter(s => s.rows === rows && (settings.only.length === 0 || settings.only.includes(s.id)))
  const kinds = SERVER_ORDER.filter(k => (settings.servers.length === 0 || settings.servers.includes(k)) && scenarios.some(s => s.servers.includes(k)))
  if (kinds.length === 0) return
  const seed = seedRows(rows)
  const expectedBody = JSON.stringify(seed)
  const ceilingData = path.join(postgres.workDir, `rows-${rows}.json`)
  writeFileSync(ceilingData, expectedBody)
  const servers = new Map<ServerKind, RunningServer>()
  const databases = new Map<ServerKind, string>()
  try {
    for (const kind of kinds) {
      const label = `${kind}-${rows}`
      const inMemory = IN_MEMORY.includes(kind)
      const databaseUrl = inMemory ? undefined : await postgres.createDatabase(`bench_${runId}_${kind}_${rows}`)
      log(`${label}: starting`)
      const server = await startServer(kind, { databaseUrl, ...(inMemory ? { ceilingData } : {}), logLevel: settings.logLevel, workDir: postgres.workDir, label })
      servers.set(kind, server)
      if (databaseUrl !== undefined) databases.set(kind, databaseUrl)
      if (!inMemory) {
        const started = performance.now()
        await seedThroughApi(server.url, seed)
        log(`${label}: seeded ${rows} rows through POST in ${Math.round(performance.now() - started)} ms`)
      }
      await checkSeeded(server, expectedBody, notes)
    }
    for (const scenario of scenarios) {
      const rounds = new Map<ServerKind, Measurement[]>()
      const grown = new Map<ServerKind, number[]>()
      const mine = kinds.filter(k => scenario.servers.includes(k))
      for (let round = 0; round < settings.rounds; round++) {
        for (const kind of [...mine.slice(round % mine.length), ...mine.slice(0, round % mine.length)]) {
          const server = servers.get(kind) as RunningServer
          const headers: Record<string, string> = { ...AUTH }
          if (scenario.id === 'etag') {
            const { etag } = await listBody(server.url)
            headers['if-none-match'] = etag ?? '"no-etag-was-sent"'
            if (round === 0 && etag === null) notes.push(`${kind}: GET /v1/categories sent no ETag, so If-None-Match was answered with full 200 responses`)
            else if (round === 0 && etag !== null && (await listBody(server.url, { 'if-none-match': etag })).status !== 304) notes.push(`${kind}: If-None-Match with the current ETag did not give 304`)
          }
          const label = `${kind}-${rows} ${scenario.title}${settings.rounds > 1 ? ` round ${round + 1}/${settings.rounds}` : ''}`
          const m = await measure(scenario, server, load, postgres, headers)
          // wrk does not tell 304 from 200: a 304 has no body, so its responses must be far smaller than the list.
          if (scenario.id === 'etag' && headers['if-none-match'] !== '"no-etag-was-sent"' && m.bytesPerResponse > Buffer.byteLength(expectedBody) / 2) {
            notes.push(`${kind}: ${label}: ${m.bytesPerResponse} bytes per response, as large as the list: If-None-Match was not answered with 304`)
          }
          rounds.set(kind, [...(rounds.get(kind) ?? []), m])
          const databaseUrl = databases.get(kind)
          if (scenario.kind !== 'get' && databaseUrl !== undefined) grown.set(kind, [...(grown.get(kind) ?? []), await restoreTable(databaseUrl, rows)])
          log(`${label}: ${Math.round(m.rps)} req/s (${Math.round(m.rpsPerCore)} per CPU second), p50 ${m.p50} ms, p99 ${m.p99} ms, failures ${m.socketErrors + m.badResponses}, peak RSS ${(m.peakRssBytes / 2 ** 20).toFixed(0)} MB, other CPU ${m.otherCpu}%, statuses ${JSON.stringify(m.statusCounts)}`)
        }
      }
      for (const kind of mine) results.push(combineRounds(rounds.get(kind) ?? []))
      for (const [kind, added] of grown) {
        notes.push(`${kind}: each round of "${scenario.title}" (with its warm-up) grew the table from ${rows} rows, by ${added.join(', ')} rows; the rows were deleted before the next round`)
      }
    }
  } finally {
    for (const server of servers.values()) await server.stop()
  }
}

async function main (): Promise<void> {
  const began = new Date()
  const builtFrom = buildSource()
  // Other work on the machine skews every number: say how busy it was.
  const loadBefore = os.loadavg()
  if ((loadBefore[0] ?? 0) > os.availableParallelism() / 2) log(`warning: the machine is busy (load average ${loadBefore.map(l => l.toFixed(2)).join(' ')}); results will be noisy`)
  log(`BENCH_DURATION=${settings.durationS} BENCH_WARMUP=${settings.warmupS} BENCH_ROUNDS=${settings.rounds} BENCH_CONNECTIONS=${settings.connections} BENCH_LOG_LEVEL=${settings.logLevel}`)
  const wanted = SERVER_ORDER.filter(k => settings.servers.length === 0 || settings.servers.includes(k))
  if (wanted.some(k => k === 'bun' || k === 'express' || k === 'hono')) ensurePeers(log)
  const load = await startLoadGenerator(log)
  log(`load generator: ${load.name}`)
  const postgres = await startPostgres()
  log(`PostgreSQL ${postgres.version} (${postgres.source}); work directory ${postgres.workDir}`)
  const results: Measurement[] = []
  const notes: string[] = []
  try {
    await runPhase(100, postgres, load, results, notes)
    await runPhase(10_000, postgres, load, results, notes)
  } finally {
    await load.stop()
    await postgres.stop()
  }
  const info: RunInfo = { began, finished: new Date(), builtFrom, loadBefore, loadAfter: os.loadavg(), postgresVersion: postgres.version, postgresSource: postgres.source, loadGenerator: load.name, bunVersion: wanted.includes('bun') ? bunVersion() : undefined, settings }
  await mkdir(settings.outDir, { recursive: true })
  await writeFile(path.join(settings.outDir, 'results.md'), markdownReport(results, notes, info))
  await writeFile(path.join(settings.outDir, 'ratios.svg'), ratiosSvg(results))
  process.stdout.write(consoleSummary(results, notes))
  log(`wrote ${path.join(settings.outDir, 'results.md')} and ratios.svg`)
}

await runToExit(main)
