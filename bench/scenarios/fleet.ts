/*
 * fleet: instances on one database, each under its own wrk at once, as a balancer splits the load. From each
 * instance's metrics: its list reads by source (a change must be applied, not rebuilt: `refresh`) and every write
 * answered other than 2xx.
 */
import { type ScenarioGroup, ratioText, row, verdict } from '../report.js'
import {
  type RunningServer, getList, log, median, numberFromEnv, readMetric, restoreTable, startSeeded, startServer
} from '../servers.js'
import { type LoadResult, runLoad, settings } from '../wrk.js'

const ROWS = numberFromEnv('FLEET_ROWS', 100_000)
const INSTANCES = numberFromEnv('FLEET_INSTANCES', 2)
const OWN_SETTINGS = { durationS: 15, connections: 20 }
const MIXED_OVER_GETS = 0.9
const MAX_REFRESHES = 5
const WRITE_METHODS = ['POST', 'PATCH', 'DELETE']
const READS = 'categories_list_reads_total'
const REQUESTS = 'http_request_duration_seconds_count'
const GETS_ONLY = 'GETs only'
const MIXED = '1 write in 20'
type Samples = Map<string, number>

interface Window { mix: string, results: LoadResult[], reads: Samples[], badWrites: Samples }

const add = (samples: Samples, key: string, n: number): Samples => samples.set(key, (samples.get(key) ?? 0) + n)
const rate = (window: Window): number => window.results.reduce((total, r) => total + r.rps, 0)
/** `{source="cache"}` 12 as `cache 12`. */
const readsText = (reads: Samples): string => [...reads].filter(([, n]) => n > 0)
  .map(([labels, n]) => `${/"(\w+)"/.exec(labels)?.[1] ?? labels} ${n}`).join(', ')
const badText = (bad: Samples): string =>
  bad.size === 0 ? 'none' : [...bad].map(([what, n]) => `${what} ×${n}`).join(', ')

const since = (after: Samples[], before: Samples[]): Samples[] =>
  after.map((samples, i) => new Map([...samples].map(([labels, n]) => [labels, n - (before[i]?.get(labels) ?? 0)])))

async function measureWindow (fleet: RunningServer[], mix: string, round: number): Promise<Window> {
  const { durationS, warmupS, connections, rounds } = settings(OWN_SETTINGS)
  const readings = async (name: string): Promise<Samples[]> =>
    await Promise.all(fleet.map(async server => await readMetric(server, name)))
  // Every instance's list built before the window, as after any start.
  for (const server of fleet) await getList(server.url)
  const readsBefore = await readings(READS)
  const requestsBefore = await readings(REQUESTS)
  const half = Math.floor(ROWS / 2)
  const results = await Promise.all(fleet.map(async (server, i) => await runLoad({
    url: server.url,
    kind: mix === GETS_ONLY ? 'get' : 'writes',
    connections,
    durationS,
    warmupS,
    // Updates in the lower half, deletes in the upper: an update never meets a deleted row.
    updateRows: half,
    deleteIds: { first: half + 1, last: ROWS, stream: round * fleet.length + i, streams: rounds * fleet.length }
  })))
  const reads = since(await readings(READS), readsBefore)
  const requests = since(await readings(REQUESTS), requestsBefore)
  const badWrites: Samples = new Map()
  for (const [labels, count] of requests.flatMap(instance => [...instance])) {
    const method = /method="(\w+)"/.exec(labels)?.[1] ?? ''
    const status = /status="(\d+)"/.exec(labels)?.[1] ?? ''
    const bad = WRITE_METHODS.includes(method) && !status.startsWith('2') && count > 0
    if (bad) add(badWrites, `${method} ${status}`, count)
  }
  return { mix, results, reads, badWrites }
}

export const fleet: ScenarioGroup = {
  ids: ['fleet'],
  run: async (postgres) => {
    const { rounds, durationS, warmupS, connections } = settings(OWN_SETTINGS)
    const first = await startSeeded('service', postgres, ROWS, { label: 'fleet-0' })
    const servers = [first.server]
    const windows: Window[] = []
    try {
      for (let i = 1; i < INSTANCES; i++) {
        servers.push(await startServer('service', first.databaseUrl, { label: `fleet-${i}` }))
      }
      for (let round = 0; round < rounds; round++) {
        for (const mix of [GETS_ONLY, MIXED]) {
          const window = await measureWindow(servers, mix, round)
          windows.push(window)
          log(`fleet round ${round + 1}, ${mix}: ${rate(window).toFixed(0)} req/s, ` +
            `reads ${window.reads.map(readsText).join(' / ')}, writes not 2xx ${badText(window.badWrites)}`)
          if (mix === MIXED) await restoreTable(first.databaseUrl, ROWS)
        }
      }
    } finally {
      for (const server of servers) await server.stop()
    }
    const ratio = median(windows.filter(w => w.mix === MIXED).map(rate)) /
      median(windows.filter(w => w.mix === GETS_ONLY).map(rate))
    const bad = windows.flatMap(w => [...w.badWrites.values()]).reduce((total, n) => total + n, 0)
    const refreshes = Math.max(0, ...windows.flatMap(w => w.reads.map(reads => reads.get('{source="refresh"}') ?? 0)))
    const lines = [
      `${INSTANCES} instances, ${ROWS.toLocaleString('en')} rows, wrk with ${connections} connections per instance, ` +
        `${durationS} s after ${warmupS} s of warm-up; list reads by source over each window and its warm-up`,
      '',
      row(['round', 'mix', 'summed req/s', 'failures', 'list reads by source', 'writes not 2xx']),
      row(['---:', '---', '---:', '---:', '---', '---']),
      ...windows.map((window, index) => row([
        String(Math.floor(index / 2) + 1),
        window.mix,
        rate(window).toFixed(0),
        String(window.results.reduce((total, r) => total + r.failures, 0)),
        window.reads.map(readsText).join(' / '),
        badText(window.badWrites)
      ]))
    ]
    const scenario = `fleet of ${INSTANCES}, ${ROWS.toLocaleString('en')} rows`
    const verdicts = [
      verdict(scenario, `1 write in 20 ≥ ${MIXED_OVER_GETS} × GETs only`, ratioText(ratio), ratio >= MIXED_OVER_GETS),
      verdict(scenario, 'no write answered other than 2xx', String(bad), bad === 0),
      verdict(scenario, `≤ ${MAX_REFRESHES} refresh reads per instance`, String(refreshes), refreshes <= MAX_REFRESHES)
    ]
    return { title: 'Fleet', lines, verdicts }
  }
}
