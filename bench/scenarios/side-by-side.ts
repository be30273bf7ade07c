// The service beside the Fastify baselines and the database-backed peers, in phases (bench/README.md).
import { execFileSync } from 'node:child_process'
import path from 'node:path'
import { cpuSeconds, machineBusyCpuSeconds, peakRssBytes, resetPeakRss } from '../proc-stats.js'
import { type ScenarioGroup, type Verdict, header, mb, ratioText, rotate, row, verdict } from '../report.js'
import {
  AUTH, DATABASE_PEERS, LIST_PATH, type Postgres, ROOT, type RunningServer, type ServerKind, getList, log,
  numberFromEnv, restoreTable, seedJson, sql, startSeeded
} from '../servers.js'
import { type LoadKind, type LoadResult, type LoadSpec, runLoad, settings } from '../wrk.js'

interface Scenario {
  id: string
  title: string
  rows: number
  /** `synchronous_commit = off` on every server's database, as fast storage makes commits cheap. */
  cheapCommits: boolean
  kind: LoadKind
  servers: ServerKind[]
  headers?: Record<string, string>
  path?: string
}

const ALL: ServerKind[] = ['ceiling', ...DATABASE_PEERS, 'baseline', 'service']
const ORDER: ServerKind[] = ['floor', ...ALL]
/** Only the service (and its baseline) update, delete, compress and send an ETag. */
const SERVICE: ServerKind[] = ['baseline', 'service']
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
  { id: 'gzip', title: 'GET, gzip', ...SMALL, kind: 'get', servers: SERVICE, headers: { 'accept-encoding': 'gzip' } },
  { id: 'br', title: 'GET, Brotli', ...SMALL, kind: 'get', servers: SERVICE, headers: { 'accept-encoding': 'br' } },
  { id: 'keys', title: 'GET list, 100 rows, a managed key', ...SMALL, kind: 'get', servers: ['service'] },
  { id: 'mixed', title: 'mixed 95% GET / 5% POST', ...SMALL, kind: 'mixed', servers: ALL },
  // Busy rows: 50 connections on 100 rows, so most updates overlap another of their row.
  { id: 'patch-hot', title: 'PATCH one of 100 rows', ...SMALL, kind: 'patch', servers: SERVICE },
  { id: 'get10k', title: 'GET list, 10,000 rows', ...LARGE, kind: 'get', servers: ALL },
  // Updates before creates: a create window adds 10⁵ rows, and the heap they took stays for the next window.
  { id: 'patch', title: 'PATCH a random row', ...LARGE, kind: 'patch', servers: SERVICE },
  { id: 'post', title: 'POST', ...LARGE, kind: 'post', servers: ALL },
  { id: 'delete', title: 'DELETE', ...LARGE, kind: 'delete', servers: SERVICE },
  { id: 'patch-cheap', title: 'PATCH, cheap commits', ...CHEAP, kind: 'patch', servers: SERVICE },
  { id: 'post-cheap', title: 'POST, cheap commits', ...CHEAP, kind: 'post', servers: [...DATABASE_PEERS, ...SERVICE] },
  { id: 'delete-cheap', title: 'DELETE, cheap commits', ...CHEAP, kind: 'delete', servers: SERVICE },
  { id: 'page', title: `GET ${PAGE}, ${PAGED.rows} rows`, ...PAGED, kind: 'get', servers: SERVICE, path: PAGE },
  { id: 'page-deep', title: `GET ${DEEP_PAGE}`, ...PAGED, kind: 'get', servers: SERVICE, path: DEEP_PAGE }
]

/** The service's rate in `scenario` ≥ `min` × that of `against` (the fastest peer, or the service in `of`). */
interface Target { scenario: string, against: ServerKind | 'best peer', min: number, of?: string }
const TARGETS: Target[] = [
  { scenario: 'get100', against: 'floor', min: 0.8 },
  { scenario: 'get100', against: 'best peer', min: 1.3 },
  { scenario: 'etag', against: 'floor', min: 0.8 },
  { scenario: 'keys', against: 'service', of: 'get100', min: 0.95 },
  { scenario: 'mixed', against: 'naive', min: 2 },
  { scenario: 'get10k', against: 'ceiling', min: 0.8 },
  { scenario: 'post', against: 'best peer', min: 1.2 },
  { scenario: 'post', against: 'naive', min: 2 },
  // An update or a delete costs no more than a create.
  { scenario: 'patch', against: 'service', of: 'post', min: 1 },
  { scenario: 'delete', against: 'service', of: 'post', min: 1 },
  { scenario: 'post-cheap', against: 'best peer', min: 1.2 },
  { scenario: 'post-cheap', against: 'naive', min: 2 },
  { scenario: 'patch-cheap', against: 'service', of: 'post-cheap', min: 1 },
  { scenario: 'delete-cheap', against: 'service', of: 'post-cheap', min: 1 },
  { scenario: 'page', against: 'service', of: 'get100', min: 0.8 },
  { scenario: 'page-deep', against: 'service', of: 'get100', min: 0.8 }
]
/**
 * Up to LARGE's rows; the page phase caches 10⁶ rows (142 MB of JSON), whose memory big-list bounds by the body.
 * Creates and deletes are not bounded: a create window adds 10⁵ rows, and a delete window's block is created first.
 */
const LIMIT_RSS = 150 * 2 ** 20
const GROWS_TABLE: LoadKind[] = ['post', 'delete']
/** Rows a delete round gets at least; more when the server created faster in this phase. */
const DELETE_ROWS = 20_000
// Deletes write no row and may run well above the create rate: a block too small would end in 404s, not deletes.
const DELETE_HEADROOM = 4

interface Measurement extends LoadResult {
  server: ServerKind
  scenario: string
  peakRssBytes: number
  /** % of one core over the measured window: the server's, and the whole machine's (a busy one shows here). */
  cpu: { server: number, machine: number }
  /** Requests per CPU second of the server process: steadier than req/s when others share the machine. */
  perCpuSecond: number
  rounds: number[]
}

const phaseOf = (s: Scenario): string => `${s.rows}${s.cheapCommits ? '-cheap' : ''}`

const find = (results: Measurement[], server: ServerKind, scenario: string): Measurement | undefined =>
  results.find(r => r.server === server && r.scenario === scenario)

function baseline (results: Measurement[], scenario: string, against: Target['against']): Measurement | undefined {
  if (against !== 'best peer') return find(results, against, scenario)
  const peers = DATABASE_PEERS.map(kind => find(results, kind, scenario)).filter(m => m !== undefined)
  return peers.sort((a, b) => b.rps - a.rps)[0]
}

function ratio (results: Measurement[], target: Target): number | undefined {
  const service = find(results, 'service', target.scenario)
  const other = baseline(results, target.of ?? target.scenario, target.against)
  // A server that answered nothing within a window (a slow list, a short window) has no ratio.
  if (service === undefined || other === undefined || other.rps === 0) return undefined
  return service.rps / other.rps
}

async function measure (scenario: Scenario, server: RunningServer, spec: LoadSpec): Promise<Measurement> {
  let start = { at: 0, server: 0, machine: 0 }
  const result = await runLoad(spec, () => {
    resetPeakRss(server.pid)
    start = { at: performance.now(), server: cpuSeconds(server.pid), machine: machineBusyCpuSeconds() }
  })
  const elapsedS = (performance.now() - start.at) / 1000
  // Never below zero: a process that exits during the window takes its CPU time with it.
  const percent = (seconds: number): number => Math.max(0, Math.round(seconds / elapsedS * 100))
  const serverCpu = percent(cpuSeconds(server.pid) - start.server)
  return {
    ...result,
    server: server.kind,
    scenario: scenario.id,
    peakRssBytes: peakRssBytes(server.pid),
    cpu: { server: serverCpu, machine: percent(machineBusyCpuSeconds() - start.machine) },
    perCpuSecond: serverCpu === 0 ? 0 : result.rps / (serverCpu / 100),
    rounds: [result.rps]
  }
}

/** Of several rounds, the one with the median req/s; the peak RSS is the highest and the failures the sum. */
function combineRounds (rounds: Measurement[]): Measurement {
  const middle = [...rounds].sort((a, b) => a.rps - b.rps)[Math.floor((rounds.length - 1) / 2)] as Measurement
  const failures = rounds.reduce((total, r) => total + r.failures, 0)
  const peakRssBytes = Math.max(...rounds.map(r => r.peakRssBytes))
  return { ...middle, failures, peakRssBytes, rounds: rounds.map(r => r.rps) }
}

/** A page must hold PAGE_LIMIT rows and name the next: else the service does not page, and its rate means nothing. */
async function checkPage (url: string): Promise<void> {
  const response = await fetch(url, { headers: AUTH })
  const rows = await response.json() as unknown[]
  const next = response.headers.get('link')?.includes('rel="next"') === true
  if (response.status !== 200 || rows.length !== PAGE_LIMIT || !next) throw new Error(`GET ${url} answered no page`)
}

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

async function loadFor (scenario: Scenario, server: RunningServer, databaseUrl: string, results: Measurement[]):
Promise<LoadSpec> {
  const { durationS, warmupS, connections } = settings()
  const headers: Record<string, string> = { ...AUTH, ...scenario.headers }
  const spec: LoadSpec = { url: server.url, kind: scenario.kind, connections, durationS, warmupS, headers }
  spec.path = scenario.path
  if (scenario.path !== undefined) await checkPage(`${server.url}${scenario.path}`)
  if (scenario.id === 'etag') headers['if-none-match'] = (await getList(server.url)).etag
  if (scenario.id === 'keys') headers.authorization = `Bearer ${managedKey(databaseUrl)}`
  if (scenario.kind === 'patch') spec.updateRows = scenario.rows
  if (scenario.kind === 'delete') {
    const createRate = find(results, server.kind, scenario.cheapCommits ? 'post-cheap' : 'post')?.rps ?? 0
    spec.deleteIds = await deleteRange(databaseUrl, createRate, durationS + warmupS)
  }
  // Deployed, the service holds its list cached (the delete block's INSERT dropped it), and every write changes it.
  if (scenario.kind === 'patch' || scenario.kind === 'delete') await getList(server.url)
  return spec
}

async function runPhase (scenarios: Scenario[], servers: ServerKind[], postgres: Postgres, results: Measurement[]):
Promise<void> {
  const first = scenarios[0] as Scenario
  const { rows, cheapCommits } = first
  const kinds = servers.filter(kind => scenarios.some(s => s.servers.includes(kind)))
  const started = new Map<ServerKind, { server: RunningServer, databaseUrl: string }>()
  const expectedBytes = Buffer.byteLength(seedJson(rows))
  try {
    for (const kind of kinds) {
      const label = `${kind}-${phaseOf(first)}`
      log(`${label}: starting`)
      const running = await startSeeded(kind, postgres, rows, { label, cheapCommits })
      started.set(kind, running)
      const list = await getList(running.server.url)
      if (list.bytes !== expectedBytes) throw new Error(`${label}: a list of ${list.bytes} bytes, not ${expectedBytes}`)
    }
    for (const scenario of scenarios) {
      const mine = kinds.filter(kind => scenario.servers.includes(kind))
      const byServer = new Map<ServerKind, Measurement[]>(mine.map(kind => [kind, []]))
      for (let round = 0; round < settings().rounds; round++) {
        for (const kind of rotate(mine, round)) {
          const { server, databaseUrl } = started.get(kind) as { server: RunningServer, databaseUrl: string }
          const m = await measure(scenario, server, await loadFor(scenario, server, databaseUrl, results))
          byServer.get(kind)?.push(m)
          // wrk does not tell a 304 from a 200, but a 304 has no body.
          if (scenario.id === 'etag' && m.bytesPerResponse > expectedBytes / 2) throw new Error(`${kind}: no 304s`)
          if (scenario.kind !== 'get' && databaseUrl !== '') await restoreTable(databaseUrl, rows)
          log(`${kind} ${scenario.title}, round ${round + 1}: ${m.rps.toFixed(0)} req/s, machine CPU ${m.cpu.machine}%`)
        }
      }
      for (const kind of mine) results.push(combineRounds(byServer.get(kind) ?? []))
    }
  } finally {
    for (const { server } of started.values()) await server.stop()
  }
}

function verdicts (results: Measurement[]): Verdict[] {
  const service = results.filter(r => r.server === 'service')
  const measured = TARGETS.filter(t => find(results, 'service', t.scenario) !== undefined).map(target => {
    const value = ratio(results, target)
    const peer = target.against === 'best peer' ? baseline(results, target.scenario, 'best peer') : undefined
    const best = peer === undefined ? '' : ` (${peer.server})`
    const title = SCENARIOS.find(s => s.id === target.scenario)?.title ?? target.scenario
    const met = value === undefined ? undefined : value >= target.min
    return verdict(title, `≥ ${target.min} × ${target.of ?? target.against}`, `${ratioText(value)}${best}`, met)
  })
  if (service.length === 0) return measured
  const failures = service.reduce((total, r) => total + r.failures, 0)
  const failed = verdict('every scenario', 'no failed request of the service', String(failures), failures === 0)
  const all = [...measured, failed]
  const bounded = service.filter(r => {
    const scenario = SCENARIOS.find(s => s.id === r.scenario)
    return scenario !== undefined && scenario.rows <= LARGE.rows && !GROWS_TABLE.includes(scenario.kind)
  })
  if (bounded.length === 0) return all
  const worst = Math.max(...bounded.map(r => r.peakRssBytes))
  const scope = `every scenario of at most ${LARGE.rows} rows but creates and deletes`
  return [...all, verdict(scope, `service peak RSS ≤ ${mb(LIMIT_RSS)} MB`, `worst ${mb(worst)} MB`, worst <= LIMIT_RSS)]
}

function tables (results: Measurement[]): string[] {
  const scenarios = SCENARIOS.filter(s => results.some(r => r.scenario === s.id))
  const ran = (kind: ServerKind): boolean => kind !== 'service' && results.some(r => r.server === kind)
  const columns: Array<Target['against']> = [...ORDER.filter(ran), 'best peer']
  const ratios = (s: Scenario): string[] =>
    columns.map(against => ratioText(ratio(results, { scenario: s.id, against, min: 0 })))
  return [
    'The service\'s requests per second over each server\'s, in the same scenario (median rounds):',
    '',
    ...header(['scenario', ...columns.map(c => `× ${c}`)]),
    ...scenarios.map(s => row([s.title, ...ratios(s)])),
    '',
    'Every measurement: the median round; failures and peak RSS over all rounds; CPU in % of one core.',
    '',
    ...header(['scenario', 'server', 'req/s', 'per CPU s', 'p99 ms', 'failures', 'bytes/resp', 'peak RSS MB',
      'server CPU', 'machine CPU', 'every round']),
    ...scenarios.flatMap(s => results.filter(r => r.scenario === s.id).map(r => row([
      s.title, r.server, r.rps.toFixed(0), r.perCpuSecond.toFixed(0), String(r.p99), String(r.failures),
      String(r.bytesPerResponse), mb(r.peakRssBytes), `${r.cpu.server}%`, `${r.cpu.machine}%`,
      r.rounds.map(rps => rps.toFixed(0)).join(' ')
    ])))
  ]
}

export const sideBySide: ScenarioGroup = {
  ids: SCENARIOS.map(s => s.id),
  run: async (postgres, ids) => {
    const chosen = (process.env.BENCH_SERVERS ?? '').split(',').filter(kind => kind !== '')
    const hasBaseline = (process.env.BENCH_BASELINE_DIR ?? '') !== ''
    const wanted = (kind: ServerKind): boolean => (chosen.length === 0 || chosen.includes(kind))
    const servers = ORDER.filter(kind => wanted(kind) && (kind !== 'baseline' || hasBaseline))
    const results: Measurement[] = []
    // A phase per table; PAGE_ROWS may name a table another phase has already.
    const chosenScenarios = SCENARIOS.filter(s => ids.includes(s.id))
    for (const phase of new Set(chosenScenarios.map(phaseOf))) {
      await runPhase(chosenScenarios.filter(s => phaseOf(s) === phase), servers, postgres, results)
    }
    const { durationS, warmupS, rounds, connections } = settings()
    const how = `wrk, ${connections} connections, ${durationS} s after ${warmupS} s of warm-up, ${rounds} round(s)`
    return { title: `Side by side (${how})`, lines: tables(results), verdicts: verdicts(results) }
  }
}
