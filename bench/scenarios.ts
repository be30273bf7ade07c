/* The scenarios, their targets, and how a measurement is judged against them. */
import { DATABASE_PEERS, type ServerKind } from './servers.js'

export type ScenarioId = 'get100' | 'etag' | 'mixed' | 'get10k' | 'post'

export interface Scenario {
  id: ScenarioId
  title: string
  /** Rows in the table when the scenario starts (the phase it runs in). */
  rows: number
  kind: 'get' | 'post' | 'mixed'
  servers: ServerKind[]
  /** Status codes that count as answers (anything else is a failure). */
  ok: (status: number) => boolean
}

const success = (status: number): boolean => status >= 200 && status < 300

const ALL: ServerKind[] = ['raw', 'ceiling', 'naive', 'express', 'hono', 'bun', 'baseline', 'service']

export const SCENARIOS: Scenario[] = [
  { id: 'get100', title: 'GET list, 100 rows', rows: 100, kind: 'get', servers: ['floor', ...ALL], ok: success },
  // Only raw, the floor and the service send an ETag; the others would answer 200, which get100 already measures.
  { id: 'etag', title: 'GET with If-None-Match (304)', rows: 100, kind: 'get', servers: ['raw', 'floor', 'baseline', 'service'], ok: s => success(s) || s === 304 },
  { id: 'mixed', title: 'mixed 95% GET / 5% POST', rows: 100, kind: 'mixed', servers: ALL, ok: success },
  { id: 'get10k', title: 'GET list, 10,000 rows', rows: 10_000, kind: 'get', servers: ALL, ok: success },
  { id: 'post', title: 'POST, 50 connections', rows: 10_000, kind: 'post', servers: ALL, ok: success }
]

export interface Measurement {
  server: ServerKind
  scenario: ScenarioId
  rps: number
  p50: number
  p99: number
  total: number
  socketErrors: number
  /** Responses with a status the scenario does not accept. */
  badResponses: number
  statusCounts: Record<string, number>
  /** Mean bytes per response, headers included. */
  bytesPerResponse: number
  peakRssBytes: number
  /** CPU of the server process, of the PostgreSQL processes and of the load generator, in % of one core over the measured window. */
  serverCpu: number
  dbCpu: number
  loadCpu: number
  /** Everything else the machine did meanwhile (other people's work skews the numbers). */
  otherCpu: number
  /**
   * Requests per CPU second of the server process (rps over its CPU share; with several rounds, the
   * median of the rounds'): on a machine others share, a server that got less of a core answers
   * fewer requests but spends the same CPU on each, so this moves less with background load.
   * It leaves out PostgreSQL's CPU: compare it only between servers that do not use the database.
   */
  rpsPerCore: number
  /** Requests per second of every round, when there were several (the median one is reported). */
  rounds?: number[]
}

/** A server, or the fastest of the database-backed peers in that scenario. */
export type Baseline = ServerKind | 'best peer'

export interface Check {
  /** The service's requests per second divided by this one's. */
  against: Baseline
  min: number
}

export interface Target { scenario: ScenarioId, checks: Check[], zeroErrors?: boolean, text: string }

export const TARGETS: Target[] = [
  { scenario: 'get100', checks: [{ against: 'floor', min: 0.8 }, { against: 'best peer', min: 1.3 }], text: 'service ≥ 0.8 × the floor (Fastify + bearer-auth, a fixed body), and ≥ 1.3 × the best database-backed peer' },
  { scenario: 'etag', checks: [{ against: 'floor', min: 0.8 }], text: 'service ≥ 0.8 × the floor\'s own 304' },
  { scenario: 'mixed', checks: [{ against: 'naive', min: 2.0 }], zeroErrors: true, text: 'service ≥ 2 × naive, and zero errors' },
  { scenario: 'get10k', checks: [{ against: 'ceiling', min: 0.8 }], text: 'service ≥ 0.8 × the Fastify ceiling' },
  { scenario: 'post', checks: [{ against: 'best peer', min: 1.2 }], text: 'service ≥ 1.2 × the best database-backed peer' }
]

export const MEMORY_LIMIT_BYTES = 150 * 1024 * 1024

export function find (results: Measurement[], server: ServerKind, scenario: ScenarioId): Measurement | undefined {
  return results.find(r => r.server === server && r.scenario === scenario)
}

/** The measurement a baseline stands for: that server's, or the fastest database-backed peer's. */
export function baseline (results: Measurement[], scenario: ScenarioId, against: Baseline): Measurement | undefined {
  if (against !== 'best peer') return find(results, against, scenario)
  const peers = DATABASE_PEERS.map(kind => find(results, kind, scenario)).filter(m => m !== undefined)
  return peers.sort((a, b) => b.rps - a.rps)[0]
}

/** The service's requests per second (or per CPU second) over the baseline's, in the same scenario. */
export function ratio (results: Measurement[], scenario: ScenarioId, against: Baseline, metric: 'rps' | 'rpsPerCore' = 'rps'): number | undefined {
  const service = find(results, 'service', scenario)
  const other = baseline(results, scenario, against)
  if (service === undefined || other === undefined || other[metric] === 0) return undefined
  return service[metric] / other[metric]
}

export interface Verdict { target: Target, met: boolean, measured: boolean, details: string[] }

export function judge (results: Measurement[]): { verdicts: Verdict[], memory: { met: boolean, worst: number } } {
  const verdicts = TARGETS.map(target => {
    const details: string[] = []
    let met = true
    let measured = true
    for (const check of target.checks) {
      const value = ratio(results, target.scenario, check.against)
      measured &&= value !== undefined
      const ok = value !== undefined && value >= check.min
      met &&= ok
      const peer = check.against === 'best peer' ? baseline(results, target.scenario, check.against)?.server : undefined
      details.push(`×${check.against}${peer === undefined ? '' : ` (${peer})`} ${value === undefined ? 'n/a' : value.toFixed(2)} (≥ ${check.min})`)
    }
    if (target.zeroErrors === true) {
      const service = find(results, 'service', target.scenario)
      const errors = service === undefined ? Number.NaN : service.socketErrors + service.badResponses
      met &&= errors === 0
      details.push(`errors ${errors}`)
    }
    return { target, met, measured, details }
  })
  const worst = Math.max(0, ...results.filter(r => r.server === 'service').map(r => r.peakRssBytes))
  return { verdicts, memory: { met: worst > 0 && worst <= MEMORY_LIMIT_BYTES, worst } }
}
