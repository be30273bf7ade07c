/*
 * The service beside the Fastify floor and ceiling and the database-backed peers, in one run: phases of fresh
 * databases and server processes (100 rows; 10,000 rows; 10,000 rows with cheap commits), in which each scenario
 * runs on each of its servers in turn, BENCH_ROUNDS rounds whose server order rotates. A round that wrote leaves
 * the table as it found it.
 */
import { execFileSync } from 'node:child_process'
import path from 'node:path'
import { cpuSeconds, machineBusyCpuSeconds, postgresCpuSeconds, watchPeakRss } from '../proc-stats.js'
import { type Context, type ScenarioGroup, type Verdict, mb, ratioText, rotate, settings } from '../report.js'
import {
  AUTH, DATABASE_PEERS, IN_MEMORY, LIST_PATH, type Postgres, ROOT, type RunningServer, type ServerKind, log, median,
  numberFromEnv, restoreTable, seedJson, sql, startSeeded
} from '../servers.js'
import { type LoadKind, type LoadSpec, runLoad } from '../wrk.js'

interface Scenario {
  id: string
  title: string
  rows: number
  /** `synchronous_commit = off` on every server's database, as fast storage makes commits cheap. */
  cheapCommits: boolean
  kind: LoadKind
  servers: ServerKind[]
  headers?: Record<string, string>
  /** Else the whole list. */
  path?: string
}

const ALL: ServerKind[] = ['ceiling', ...DATABASE_PEERS, 'baseline', 'service']
const WITH_DATABASE: ServerKind[] = [...DATABASE_PEERS, 'baseline', 'service']
/** Only the service (and its baseline) update, delete, compress and send an ETag. */
const SERVICE: ServerKind[] = ['baseline', 'service']
const GZIP = { 'accept-encoding': 'gzip' }
const BROTLI = { 'accept-encoding': 'br' }
const SMALL = { rows: 100, cheapCommits: false }
const LARGE = { rows: 10_000, cheapCommits: false }
const CHEAP = { rows: 10_000, cheapCommits: true }
/** A page of a large list against the whole of a small one (get100): a page is served from the cached list. */
const PAGED = { rows: numberFromEnv('PAGE_ROWS', 1_000_000), cheapCommits: false }
const PAGE_LIMIT = 100
const DEEP_SHARE = 0.9
const PAGE = `${LIST_PATH}?limit=${PAGE_LIMIT}`
const DEEP_PAGE = `${PAGE}&after=${Math.floor(PAGED.rows * DEEP_SHARE)}`

const SCENARIOS: Scenario[] = [
  { id: 'get100', title: 'GET list, 100 rows', ...SMALL, kind: 'get', servers: ['floor', ...ALL] },
  { id: 'etag', title: 'GET with If-None-Match (304)', ...SMALL, kind: 'get', servers: ['floor', ...SERVICE] },
  { id: 'gzip', title: 'GET list, 100 rows, gzip', ...SMALL, kind: 'get', servers: SERVICE, headers: GZIP },
  { id: 'br', title: 'GET list, 100 rows, Brotli', ...SMALL, kind: 'get', servers: SERVICE, headers: BROTLI },
  { id: 'keys', title: 'GET list, 100 rows, a managed key', ...SMALL, kind: 'get', servers: ['service'] },
  { id: 'mixed', title: 'mixed 95% GET / 5% POST', ...SMALL, kind: 'mixed', servers: ALL },
  { id: 'get10k', title: 'GET list, 10,000 rows', ...LARGE, kind: 'get', servers: ALL },
  { id: 'post', title: 'POST', ...LARGE, kind: 'post', servers: ALL },
  { id: 'patch', title: 'PATCH a random row', ...LARGE, kind: 'patch', servers: SERVICE },
  { id: 'delete', title: 'DELETE', ...LARGE, kind: 'delete', servers: SERVICE },
  { id: 'post-cheap', title: 'POST, cheap commits', ...CHEAP, kind: 'post', servers: WITH_DATABASE },
  { id: 'patch-cheap', title: 'PATCH, cheap commits', ...CHEAP, kind: 'patch', servers: SERVICE },
  { id: 'delete-cheap', title: 'DELETE, cheap commits', ...CHEAP, kind: 'delete', servers: SERVICE },
  { id: 'page', title: `GET ${PAGE}, ${PAGED.rows} rows`, ...PAGED, kind: 'get', servers: SERVICE, path: PAGE },
  { id: 'page-deep', title: `GET ${DEEP_PAGE}`, ...PAGED, kind: 'get', servers: SERVICE, path: DEEP_PAGE }
]

/** Another server, the fastest database-backed peer, or the service itself in another scenario. */
interface Check { against: ServerKind | 'best peer', min: number, scenario?: string }
interface Target { scenario: string, checks: Check[], zeroErrors?: boolean }

const CREATE_TARGETS: Check[] = [{ against: 'best peer', min: 1.2 }, { against: 'naive', min: 2 }]
/** An update or a delete costs no more than a create. */
const AS_CHEAP_AS = (scenario: string): Check[] => [{ against: 'service', scenario, min: 1 }]
const TARGETS: Target[] = [
  { scenario: 'get100', checks: [{ against: 'floor', min: 0.8 }, { against: 'best peer', min: 1.3 }] },
  { scenario: 'etag', checks: [{ against: 'floor', min: 0.8 }] },
  { scenario: 'keys', checks: [{ against: 'service', scenario: 'get100', min: 0.95 }] },
  { scenario: 'mixed', checks: [{ against: 'naive', min: 2 }], zeroErrors: true },
  { scenario: 'get10k', checks: [{ against: 'ceiling', min: 0.8 }] },
  { scenario: 'post', checks: CREATE_TARGETS },
  { scenario: 'patch', checks: AS_CHEAP_AS('post'), zeroErrors: true },
  { scenario: 'delete', checks: AS_CHEAP_AS('post'), zeroErrors: true },
  { scenario: 'post-cheap', checks: CREATE_TARGETS },
  { scenario: 'patch-cheap', checks: AS_CHEAP_AS('post-cheap'), zeroErrors: true },
  { scenario: 'delete-cheap', checks: AS_CHEAP_AS('post-cheap'), zeroErrors: true },
  { scenario: 'page', checks: [{ against: 'service', scenario: 'get100', min: 0.8 }] },
  { scenario: 'page-deep', checks: [{ against: 'service', scenario: 'get100', min: 0.8 }] }
]
const MEMORY_LIMIT_BYTES = 150 * 2 ** 20
/** Rows a delete round gets at least; more when the server created faster in this phase. */
const DELETE_ROWS = numberFromEnv('WRITES_DELETE_ROWS', 20_000)
// Deletes write no row and may run well above the create rate: a block too small would end in 404s, not deletes.
const DELETE_HEADROOM = 4

interface Measurement {
  server: ServerKind
  scenario: string
  rps: number
  p99: number
  failures: number
  bytesPerResponse: number
  peakRssBytes: number
  /** % of one core over the measured window: the server, PostgreSQL, wrk, and the rest of the machine. */
  cpu: { server: number, db: number, load: number, other: number }
  /** Requests per CPU second of the server process: steadier than req/s when others share the machine. */
  perCpuSecond: number
  rounds: number[]
}

const find = (results: Measurement[], server: ServerKind, scenario: string): Measurement | undefined =>
  results.find(r => r.server === server && r.scenario === scenario)

function baseline (results: Measurement[], scenario: string, against: Check['against']): Measurement | undefined {
  if (against !== 'best peer') return find(results, against, scenario)
  const peers = DATABASE_PEERS.map(kind => find(results, kind, scenario)).filter(m => m !== undefined)
  return peers.sort((a, b) => b.rps - a.rps)[0]
}

function ratio (results: Measurement[], scenario: string, check: Check): number | undefined {
  const service = find(results, 'service', scenario)
  const other = baseline(results, check.scenario ?? scenario, check.against)
  // A server that answered nothing within a window (a slow list, a short window) has no ratio.
  if (service === undefined || other === undefined || other.rps === 0) return undefined
  return service.rps / other.rps
}

async function measure (scenario: Scenario, server: RunningServer, spec: LoadSpec, postgres: Postgres):
Promise<Measurement> {
  let rss: { stop: () => number } | undefined
  let start = { at: 0, server: 0, db: 0, machine: 0 }
  const result = await runLoad(spec, () => {
    rss = watchPeakRss(server.pid)
    const db = postgresCpuSeconds(postgres.postmasterPid)
    start = { at: performance.now(), server: cpuSeconds(server.pid), db, machine: machineBusyCpuSeconds() }
  })
  const peakRssBytes = rss?.stop() ?? 0
  const elapsedS = (performance.now() - start.at) / 1000
  // Never below zero: a process that exits during the window takes its CPU time with it.
  const percent = (seconds: number): number => Math.max(0, Math.round(seconds / elapsedS * 100))
  const serverCpu = percent(cpuSeconds(server.pid) - start.server)
  const db = IN_MEMORY.includes(server.kind) ? 0 : percent(postgresCpuSeconds(postgres.postmasterPid) - start.db)
  const load = percent(result.cpuSeconds)
  const other = Math.max(0, percent(machineBusyCpuSeconds() - start.machine) - serverCpu - db - load)
  return {
    server: server.kind,
    scenario: scenario.id,
    rps: result.rps,
    p99: result.p99,
    failures: result.socketErrors + result.badStatuses,
    bytesPerResponse: result.bytesPerResponse,
    peakRssBytes,
    cpu: { server: serverCpu, db, load, other },
    perCpuSecond: serverCpu === 0 ? 0 : result.rps / (serverCpu / 100),
    rounds: [result.rps]
  }
}

/** Of several rounds, the one with the median req/s; the peak RSS is the highest and the failures the sum. */
function combineRounds (rounds: Measurement[]): Measurement {
  const middle = [...rounds].sort((a, b) => a.rps - b.rps)[Math.floor((rounds.length - 1) / 2)] as Measurement
  return {
    ...middle,
    failures: rounds.reduce((total, r) => total + r.failures, 0),
    peakRssBytes: Math.max(...rounds.map(r => r.peakRssBytes)),
    perCpuSecond: median(rounds.map(r => r.perCpuSecond)),
    rounds: rounds.map(r => r.rps)
  }
}

/** The list, asked without Accept-Encoding as wrk asks (the compressed list's tag would never match). */
async function identityList (url: string): Promise<{ status: number, bytes: number, etag: string }> {
  const response = await fetch(`${url}${LIST_PATH}`, { headers: { ...AUTH, 'accept-encoding': 'identity' } })
  const bytes = (await response.arrayBuffer()).byteLength
  return { status: response.status, bytes, etag: response.headers.get('etag') ?? '"no tag was sent"' }
}

/** A page must hold PAGE_LIMIT rows and name the next: else the service does not page, and its rate means nothing. */
async function checkPage (url: string): Promise<void> {
  const response = await fetch(url, { headers: AUTH })
  const rows = await response.json() as unknown[]
  const next = response.headers.get('link')?.includes('rel="next"') === true
  if (response.status !== 200 || rows.length !== PAGE_LIMIT || !next) throw new Error(`GET ${url} answered no page`)
}

/** A managed key (`npm run keys`) in the server's own database. */
function managedKey (databaseUrl: string): string {
  const args = [path.join(ROOT, 'dist', 'keys', 'command.js'), 'create', '--name', 'bench', '--scope', 'read']
  const env = { PATH: process.env.PATH, DATABASE_URL: databaseUrl }
  return execFileSync(process.execPath, args, { env, encoding: 'utf8' }).trimEnd().split('\n').at(-1) ?? ''
}

/** A block of fresh rows for a delete round, enough for the rate at which this server created in this phase. */
async function deleteRange (databaseUrl: string, createRate: number, seconds: number):
Promise<{ first: number, last: number }> {
  const rows = Math.max(DELETE_ROWS, Math.ceil(createRate * seconds * DELETE_HEADROOM))
  const { rows: [range] } = await sql(databaseUrl, `WITH block AS (INSERT INTO categories (name)
    SELECT 'to delete ' || i FROM generate_series(1, $1::int) AS i RETURNING id)
    SELECT min(id)::int AS first, max(id)::int AS last FROM block`, [rows])
  await sql(databaseUrl, 'VACUUM ANALYZE categories')
  return range as { first: number, last: number }
}

type Started = Map<ServerKind, { server: RunningServer, databaseUrl: string | undefined }>

async function loadFor (scenario: Scenario, kind: ServerKind, started: Started, results: Measurement[],
  context: Context): Promise<LoadSpec> {
  const { server, databaseUrl = '' } = started.get(kind) ?? {}
  if (server === undefined) throw new Error(`${kind} is not running`)
  const { durationS, warmupS, connections } = settings()
  const headers: Record<string, string> = { ...AUTH, ...scenario.headers }
  const { url } = server
  const { kind: load, rows } = scenario
  const namePrefix = context.runId
  const spec: LoadSpec = { url, kind: load, connections, durationS, warmupS, headers, namePrefix, path: scenario.path }
  if (scenario.path !== undefined) await checkPage(`${url}${scenario.path}`)
  if (scenario.id === 'etag') headers['if-none-match'] = (await identityList(server.url)).etag
  if (scenario.id === 'keys') headers.authorization = `Bearer ${managedKey(databaseUrl)}`
  if (load === 'patch') spec.updateIds = { first: 1, last: rows }
  if (load === 'delete') {
    const createRate = find(results, kind, scenario.cheapCommits ? 'post-cheap' : 'post')?.rps ?? 0
    spec.deleteIds = { ...await deleteRange(databaseUrl, createRate, durationS + warmupS), stream: 0, streams: 1 }
    // The block's INSERT dropped the service's cached list: deployed, it holds one, and every delete changes it.
    await identityList(server.url)
  }
  if (load === 'patch') await identityList(server.url)
  return spec
}

async function runPhase (scenarios: Scenario[], servers: ServerKind[], context: Context, results: Measurement[],
  notes: string[]): Promise<void> {
  const { rows, cheapCommits } = scenarios[0] as Scenario
  const { rounds } = settings()
  const kinds = servers.filter(kind => scenarios.some(s => s.servers.includes(kind)))
  const started: Started = new Map()
  const expectedBytes = Buffer.byteLength(seedJson(rows))
  try {
    for (const kind of kinds) {
      const label = `${kind}-${rows}${cheapCommits ? '-cheap' : ''}`
      log(`${label}: starting`)
      const database = `bench_${context.runId}_${label.replaceAll('-', '_')}`
      started.set(kind, await startSeeded(kind, context.postgres, rows, { label, database, cheapCommits }))
      const list = await identityList(started.get(kind)?.server.url ?? '')
      const seeded = list.status === 200 && list.bytes === expectedBytes
      if (!seeded) notes.push(`${label}: the seeded list was ${list.bytes} bytes, not ${expectedBytes}`)
    }
    for (const scenario of scenarios) {
      const mine = kinds.filter(kind => scenario.servers.includes(kind))
      const byServer = new Map<ServerKind, Measurement[]>(mine.map(kind => [kind, []]))
      for (let round = 0; round < rounds; round++) {
        for (const kind of rotate(mine, round)) {
          const { server, databaseUrl } = started.get(kind) ?? {}
          if (server === undefined) continue
          const spec = await loadFor(scenario, kind, started, results, context)
          const m = await measure(scenario, server, spec, context.postgres)
          byServer.get(kind)?.push(m)
          // wrk does not tell a 304 from a 200, but a 304 has no body.
          const bodies = m.bytesPerResponse > expectedBytes / 2
          if (scenario.id === 'etag' && bodies) notes.push(`${kind}: the 304s were 200s`)
          const wrote = scenario.kind !== 'get' && databaseUrl !== undefined
          const added = wrote ? await restoreTable(databaseUrl, rows) : 0
          log(`${kind} ${scenario.title}, round ${round + 1}/${rounds}: ${m.rps.toFixed(0)} req/s, ` +
            `failures ${m.failures}, peak RSS ${mb(m.peakRssBytes)} MB, other CPU ${m.cpu.other}%, ` +
            `rows deleted after it ${added}`)
        }
      }
      for (const kind of mine) results.push(combineRounds(byServer.get(kind) ?? []))
    }
  } finally {
    for (const { server } of started.values()) await server.stop()
  }
}

function verdict (results: Measurement[], target: Target): Verdict {
  const values = target.checks.map(check => ratio(results, target.scenario, check))
  const measured = target.checks.map((check, i) => {
    const peer = baseline(results, target.scenario, check.against)?.server ?? 'none'
    const best = check.against === 'best peer' ? ` (${peer})` : ''
    return `× ${check.scenario ?? check.against}${best} ${ratioText(values[i])}`
  })
  const wanted = target.checks.map(c => `× ${c.scenario ?? c.against} ≥ ${c.min}`)
  const failures = find(results, 'service', target.scenario)?.failures ?? 0
  if (target.zeroErrors === true) {
    measured.push(`failures ${failures}`)
    wanted.push('no failures')
  }
  const below = target.checks.some((check, i) => (values[i] ?? Infinity) < check.min)
  const missed = below || (target.zeroErrors === true && failures > 0)
  let met: boolean | undefined = !missed
  if (!missed && values.includes(undefined)) met = undefined
  const title = SCENARIOS.find(s => s.id === target.scenario)?.title ?? target.scenario
  return { scenario: title, target: wanted.join(', '), measured: measured.join(', '), met }
}

function verdicts (results: Measurement[]): Verdict[] {
  const measured = TARGETS.filter(t => find(results, 'service', t.scenario) !== undefined).map(t => verdict(results, t))
  const worst = Math.max(0, ...results.filter(r => r.server === 'service').map(r => r.peakRssBytes))
  return [...measured, {
    scenario: 'memory',
    target: `service peak RSS ≤ ${mb(MEMORY_LIMIT_BYTES)} MB in every scenario`,
    measured: `worst ${mb(worst)} MB`,
    met: worst === 0 ? undefined : worst <= MEMORY_LIMIT_BYTES
  }]
}

const row = (cells: string[]): string => `| ${cells.join(' | ')} |`

function tables (results: Measurement[], notes: string[]): string[] {
  const scenarios = SCENARIOS.filter(s => results.some(r => r.scenario === s.id))
  const ran = (kind: ServerKind): boolean => kind !== 'service' && results.some(r => r.server === kind)
  const others = (['floor', ...ALL] as ServerKind[]).filter(ran)
  const columns: Array<Check['against']> = [...others, 'best peer']
  const ratios = (s: Scenario): string[] => columns.map(c => ratioText(ratio(results, s.id, { against: c, min: 0 })))
  return [
    'The service\'s requests per second over each server\'s, in the same scenario (median rounds):',
    '',
    row(['scenario', ...columns.map(c => `× ${c}`)]),
    row(['---', ...columns.map(() => '---:')]),
    ...scenarios.map(s => row([s.title, ...ratios(s)])),
    '',
    'Every measurement: the median round; failures and peak RSS over all rounds; CPU in % of one core.',
    '',
    row(['scenario', 'server', 'req/s', 'per CPU s', 'p99 ms', 'failures', 'bytes/resp', 'peak RSS MB',
      'server CPU', 'db CPU', 'wrk CPU', 'other CPU', 'every round']),
    row(['---', '---', ...Array.from({ length: 10 }, () => '---:'), '---']),
    ...scenarios.flatMap(s => results.filter(r => r.scenario === s.id).map(r => row([
      s.title, r.server, r.rps.toFixed(0), r.perCpuSecond.toFixed(0), String(r.p99), String(r.failures),
      String(r.bytesPerResponse), mb(r.peakRssBytes), `${r.cpu.server}%`, `${r.cpu.db}%`, `${r.cpu.load}%`,
      `${r.cpu.other}%`, r.rounds.map(rps => rps.toFixed(0)).join(' ')
    ]))),
    '',
    ...notes.map(note => `- ${note}`)
  ]
}

export const sideBySide: ScenarioGroup = {
  ids: SCENARIOS.map(s => s.id),
  byDefault: true,
  run: async (context, ids) => {
    const order: ServerKind[] = ['floor', 'ceiling', ...DATABASE_PEERS, 'baseline', 'service']
    const chosen = (process.env.BENCH_SERVERS ?? '').split(',').filter(kind => kind !== '')
    const hasBaseline = (process.env.BENCH_BASELINE_DIR ?? '') !== ''
    const wanted = (kind: ServerKind): boolean => chosen.length === 0 || chosen.includes(kind)
    const servers = order.filter(kind => wanted(kind) && (kind !== 'baseline' || hasBaseline))
    const results: Measurement[] = []
    const notes: string[] = []
    const same = (a: typeof SMALL, b: typeof SMALL): boolean => a.rows === b.rows && a.cheapCommits === b.cheapCommits
    // PAGE_ROWS may name a table another phase has already.
    const phases = [SMALL, LARGE, CHEAP, PAGED].filter((phase, i, all) => all.findIndex(p => same(p, phase)) === i)
    for (const phase of phases) {
      const scenarios = SCENARIOS.filter(s => ids.includes(s.id) && same(s, phase))
      if (scenarios.length > 0) await runPhase(scenarios, servers, context, results, notes)
    }
    const { durationS, warmupS, rounds, connections } = settings()
    const how = `wrk, ${connections} connections, ${durationS} s after ${warmupS} s of warm-up, ${rounds} round(s)`
    return [{ title: `Side by side (${how})`, lines: tables(results, notes), verdicts: verdicts(results) }]
  }
}
