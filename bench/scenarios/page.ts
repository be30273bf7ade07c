/*
 * page: a page of a large list against the whole of a small one, in one run. Two service instances, one on a table
 * of PAGE_ROWS rows (1,000,000), one on 100 rows; wrk GETs `?limit=100` and a page deep into the large list
 * (`after` the id at nine tenths) from the first, the whole list from the second, in rounds whose order rotates.
 */
import { type ScenarioGroup, ratioText, rotate, settings } from '../report.js'
import { AUTH, LIST_PATH, type RunningServer, log, median, numberFromEnv, startSeeded } from '../servers.js'
import { runLoad } from '../wrk.js'

const ROWS = numberFromEnv('PAGE_ROWS', 1_000_000)
const SMALL_ROWS = 100
const LIMIT = 100
const DEEP_SHARE = 0.9
const PAGE_OVER_SMALL_LIST = 0.8

/** A page must hold LIMIT rows and name the next one: else the service does not page, and the rates mean nothing. */
async function checkPage (url: string): Promise<void> {
  const response = await fetch(url, { headers: AUTH })
  const rows = await response.json() as unknown
  const link = response.headers.get('link') ?? ''
  if (response.status !== 200 || !Array.isArray(rows) || rows.length !== LIMIT || !link.includes('rel="next"')) {
    throw new Error(`GET ${url} did not answer a page of ${LIMIT} rows with a next link (status ${response.status})`)
  }
}

export const page: ScenarioGroup = {
  ids: ['page'],
  byDefault: false,
  run: async ({ postgres, runId }) => {
    const { durationS, warmupS, rounds, connections } = settings()
    const deepAfter = Math.floor(ROWS * DEEP_SHARE)
    const rows = ROWS.toLocaleString('en')
    const first = `?limit=${LIMIT}`
    const deep = `?limit=${LIMIT}&after=${deepAfter}`
    const large = await startSeeded('service', postgres, ROWS, { label: 'page-large', database: `page_${runId}_large` })
    let small: RunningServer | undefined
    const rates = new Map<string, number[]>()
    try {
      const smallOptions = { label: 'page-small', database: `page_${runId}_small` }
      small = (await startSeeded('service', postgres, SMALL_ROWS, smallOptions)).server
      const loads = [
        { name: `whole list, ${SMALL_ROWS} rows`, url: small.url, path: LIST_PATH },
        { name: `${first}, ${rows} rows`, url: large.server.url, path: `${LIST_PATH}${first}` },
        { name: `${deep}, ${rows} rows`, url: large.server.url, path: `${LIST_PATH}${deep}` }
      ]
      for (const load of loads.slice(1)) await checkPage(`${load.url}${load.path}`)
      for (let round = 0; round < rounds; round++) {
        for (const load of rotate(loads, round)) {
          const result = await runLoad({ url: load.url, path: load.path, kind: 'get', connections, durationS, warmupS })
          if (result.socketErrors + result.badStatuses > 0) throw new Error(`${load.name}: failed requests`)
          rates.set(load.name, [...(rates.get(load.name) ?? []), result.rps])
          log(`page round ${round + 1}, ${load.name}: ${result.rps.toFixed(0)} req/s`)
        }
      }
    } finally {
      await small?.stop()
      await large.server.stop()
    }
    const measured = [...rates].map(([name, values]) => ({ name, rps: median(values), values }))
    const wholeRps = measured[0]?.rps ?? NaN
    const lines = [
      `wrk, ${connections} connections, ${durationS} s after ${warmupS} s of warm-up, ${rounds} round(s); medians`,
      '',
      '| GET | req/s | × the small whole list | every round |',
      '|---|---:|---:|---|',
      ...measured.map(load => `| ${load.name} | ${load.rps.toFixed(0)} | ${ratioText(load.rps / wholeRps)} | ` +
        `${load.values.map(v => v.toFixed(0)).join(' ')} |`)
    ]
    const verdicts = measured.slice(1).map(load => ({
      scenario: 'page',
      target: `${load.name} ≥ ${PAGE_OVER_SMALL_LIST} × the whole list of ${SMALL_ROWS} rows`,
      measured: ratioText(load.rps / wholeRps),
      met: load.rps / wholeRps >= PAGE_OVER_SMALL_LIST
    }))
    return [{ title: 'A page of a large list', lines, verdicts }]
  }
}
