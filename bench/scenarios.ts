/* The scenarios and targets of issue 4, and how a measurement is judged against them. */
import type { ServerKind } from './servers.js'

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

export const SCENARIOS: Scenario[] = [
  { id: 'get100', title: 'GET list, 100 rows', rows: 100, kind: 'get', servers: ['ceiling', 'naive', 'service'], ok: success },
  // The ceiling has no ETag: the service's 304 is compared with the ceiling's GET 100 rows. Naive has none either and answers 200.
  { id: 'etag', title: 'GET with If-None-Match (304)', rows: 100, kind: 'get', servers: ['naive', 'service'], ok: s => success(s) || s === 304 },
  { id: 'mixed', title: 'mixed 95% GET / 5% POST', rows: 100, kind: 'mixed', servers: ['ceiling', 'naive', 'service'], ok: success },
  { id: 'get10k', title: 'GET list, 10,000 rows', rows: 10_000, kind: 'get', servers: ['ceiling', 'naive', 'service'], ok: success },
  { id: 'post', title: 'POST, 50 connections', rows: 10_000, kind: 'post', servers: ['ceiling', 'naive', 'service'], ok: success }
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
  peakRssBytes: number
  /** CPU of the server process, of the PostgreSQL processes and of the load generator, in % of one core over the measured window. */
  serverCpu: number
  dbCpu: number
  loadCpu: number
  /** Everything else the machine did meanwhile (other people's work skews the numbers). */
  otherCpu: number
  /** Requests per second of every round, when there were several (the median one is reported). */
  rounds?: number[]
}

export interface Check {
  /** service/naive or service/ceiling */
  against: 'naive' | 'ceiling'
  min: number
  /** The ceiling scenario to compare with, when not the same one. */
  ceilingScenario?: ScenarioId
}

export interface Target { scenario: ScenarioId, checks: Check[], zeroErrors?: boolean, text: string }

export const TARGETS: Target[] = [
  { scenario: 'get100', checks: [{ against: 'ceiling', min: 0.85 }, { against: 'naive', min: 2.5 }], text: 'service ≥ 0.85 × ceiling, and ≥ 2.5 × naive' },
  { scenario: 'get10k', checks: [{ against: 'ceiling', min: 0.8 }], text: 'service ≥ 0.8 × ceiling' },
  { scenario: 'etag', checks: [{ against: 'ceiling', min: 1.0, ceilingScenario: 'get100' }], text: 'service ≥ 1.0 × ceiling of GET 100 rows' },
  { scenario: 'post', checks: [{ against: 'naive', min: 2.0 }], text: 'service ≥ 2.0 × naive' },
  { scenario: 'mixed', checks: [{ against: 'naive', min: 2.0 }], zeroErrors: true, text: 'service ≥ 2.0 × naive, and zero errors' }
]

export const MEMORY_LIMIT_BYTES = 150 * 1024 * 1024

export function find (results: Measurement[], server: ServerKind, scenario: ScenarioId): Measurement | undefined {
  return results.find(r => r.server === server && r.scenario === scenario)
}

/** service/naive and service/ceiling requests per second; the 304 scenario compares with the ceiling's GET 100 rows. */
export function ratio (results: Measurement[], scenario: ScenarioId, against: 'naive' | 'ceiling'): number | undefined {
  const service = find(results, 'service', scenario)
  const otherScenario = against === 'ceiling' && scenario === 'etag' ? 'get100' : scenario
  const other = find(results, against, otherScenario)
  if (service === undefined || other === undefined || other.rps === 0) return undefined
  return service.rps / other.rps
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
      details.push(`×${check.against} ${value === undefined ? 'n/a' : value.toFixed(2)} (≥ ${check.min})`)
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
