/*
 * fleet: FLEET_INSTANCES instances of the service (2) on one database of FLEET_ROWS rows (100,000), each under its
 * own wrk at once, as a balancer splits the load: GETs of the whole list only, then one write in twenty, the writes
 * in turn a create, an update of a random row and a delete. From each instance's metrics: its list reads by source
 * (a change must be applied, not rebuilt: `refresh`) and every write answered other than 2xx.
 */
import { type ScenarioGroup, type Verdict, ratioText, settings, sum } from '../report.js'
import {
  AUTH, LIST_PATH, type RunningServer, growth, log, median, numberFromEnv, readMetric, restoreTable, seedBySql,
  startServer
} from '../servers.js'
import { type LoadResult, runLoad } from '../wrk.js'

const ROWS = numberFromEnv('FLEET_ROWS', 100_000)
const INSTANCES = numberFromEnv('FLEET_INSTANCES', 2)
const OWN_SETTINGS = { durationS: 15, connections: 20 }
const MIXED_OVER_GETS = 0.9
const MAX_REFRESHES = 5
const WRITE_METHODS = ['POST', 'PATCH', 'DELETE']
const READS = 'categories_list_reads_total'
const REQUESTS = 'http_request_duration_seconds_count'
const MIXES = ['GETs only', '1 write in 20'] as const
type Mix = typeof MIXES[number]
type Samples = Map<string, number>

interface Window { mix: Mix, results: LoadResult[], reads: Samples[], badWrites: Samples }

const add = (samples: Samples, key: string, n: number): Samples => samples.set(key, (samples.get(key) ?? 0) + n)

/** `method status` of every write answered other than 2xx, summed over the instances. */
function badWrites (requests: Samples[]): Samples {
  const bad: Samples = new Map()
  for (const [labels, count] of requests.flatMap(instance => [...instance])) {
    const method = /method="(\w+)"/.exec(labels)?.[1] ?? ''
    const status = /status="(\d+)"/.exec(labels)?.[1] ?? ''
    if (!WRITE_METHODS.includes(method) || status.startsWith('2') || count === 0) continue
    add(bad, `${method} ${status}`, count)
  }
  return bad
}

async function measureWindow (fleet: RunningServer[], mix: Mix, round: number, runId: string): Promise<Window> {
  const { durationS, warmupS, connections, rounds } = settings(OWN_SETTINGS)
  const readings = async (name: string): Promise<Samples[]> =>
    await Promise.all(fleet.map(async server => await readMetric(server, name)))
  // Every instance's list built before the window, as after any start.
  for (const server of fleet) await (await fetch(`${server.url}${LIST_PATH}`, { headers: AUTH })).arrayBuffer()
  const readsBefore = await readings(READS)
  const requestsBefore = await readings(REQUESTS)
  const half = Math.floor(ROWS / 2)
  const results = await Promise.all(fleet.map(async (server, i) => await runLoad({
    url: server.url,
    kind: mix === 'GETs only' ? 'get' : 'writes',
    connections,
    durationS,
    warmupS,
    namePrefix: `fleet-${runId}-${i}`,
    // Updates in the lower half, deletes in the upper: an update never meets a deleted row.
    updateIds: { first: 1, last: half },
    deleteIds: { first: half + 1, last: ROWS, stream: round * fleet.length + i, streams: rounds * fleet.length }
  })))
  const reads = (await readings(READS)).map((after, i) => growth(after, readsBefore[i] ?? new Map()))
  const requests = (await readings(REQUESTS)).map((after, i) => growth(after, requestsBefore[i] ?? new Map()))
  return { mix, results, reads, badWrites: badWrites(requests) }
}

const rate = (window: Window): number => sum(window.results.map(r => r.rps))
/** `{source="cache"}` 12 as `cache 12`. */
const readsText = (reads: Samples): string => [...reads].filter(([, n]) => n > 0)
  .map(([labels, n]) => `${/"(\w+)"/.exec(labels)?.[1] ?? labels} ${n}`).join(', ')
const badText = (bad: Samples): string =>
  bad.size === 0 ? 'none' : [...bad].map(([what, n]) => `${what} ×${n}`).join(', ')

function row (window: Window, index: number): string {
  const cells = [
    String(Math.floor(index / MIXES.length) + 1),
    window.mix,
    rate(window).toFixed(0),
    window.results.map(r => r.rps.toFixed(0)).join(' + '),
    window.results.map(r => `${r.p99} ms`).join(' / '),
    String(sum(window.results.map(r => r.socketErrors + r.badStatuses))),
    window.reads.map(readsText).join(' / '),
    badText(window.badWrites)
  ]
  return `| ${cells.join(' | ')} |`
}

export const fleet: ScenarioGroup = {
  ids: ['fleet'],
  byDefault: false,
  run: async ({ postgres, runId }) => {
    const { rounds, durationS, warmupS, connections } = settings(OWN_SETTINGS)
    const databaseUrl = await postgres.createDatabase(`fleet_${runId}`)
    const servers: RunningServer[] = []
    const windows: Window[] = []
    try {
      for (let i = 0; i < INSTANCES; i++) {
        servers.push(await startServer('service', { label: `fleet-${i}`, workDir: postgres.workDir, databaseUrl }))
        if (i === 0) await seedBySql(databaseUrl, ROWS)
      }
      for (let round = 0; round < rounds; round++) {
        for (const mix of MIXES) {
          const window = await measureWindow(servers, mix, round, runId)
          windows.push(window)
          log(`fleet round ${round + 1}, ${mix}: ${rate(window).toFixed(0)} req/s, ` +
            `reads ${window.reads.map(readsText).join(' / ')}, writes not 2xx ${badText(window.badWrites)}`)
          if (mix !== 'GETs only') await restoreTable(databaseUrl, ROWS)
        }
      }
    } finally {
      for (const server of servers) await server.stop()
    }
    const medianRate = (mix: Mix): number => median(windows.filter(w => w.mix === mix).map(rate))
    const ratio = medianRate('1 write in 20') / medianRate('GETs only')
    const bad: Samples = new Map()
    for (const [what, n] of windows.flatMap(w => [...w.badWrites])) add(bad, what, n)
    const refreshes = Math.max(0, ...windows.flatMap(w => w.reads.map(reads => reads.get('{source="refresh"}') ?? 0)))
    const lines = [
      `${INSTANCES} instances, ${ROWS.toLocaleString('en')} rows, wrk with ${connections} connections per instance, ` +
        `${durationS} s after ${warmupS} s of warm-up; list reads by source over each window and its warm-up`,
      '',
      '| round | mix | summed req/s | per instance | p99 | failures | list reads by source | writes not 2xx |',
      '|---:|---|---:|---|---|---:|---|---|',
      ...windows.map(row)
    ]
    const scenario = `fleet of ${INSTANCES}, ${ROWS.toLocaleString('en')} rows`
    const verdict = (target: string, measured: string, met: boolean): Verdict => ({ scenario, target, measured, met })
    const verdicts = [
      verdict(`one write in 20 ≥ ${MIXED_OVER_GETS} × the GETs-only rate`, ratioText(ratio), ratio >= MIXED_OVER_GETS),
      verdict('no write answered other than 2xx', badText(bad), bad.size === 0),
      verdict(`at most ${MAX_REFRESHES} refresh reads per instance`, `at most ${refreshes}`, refreshes <= MAX_REFRESHES)
    ]
    return [{ title: 'Fleet', lines, verdicts }]
  }
}
