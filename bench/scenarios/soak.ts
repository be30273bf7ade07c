/*
 * soak: the service alone under the mixed load at a steady rate, not flat out: every POST adds a row, and at full
 * speed the soak would measure a growing list instead of a leak.
 */
import { peakRssBytes, resetPeakRss, rssBytes } from '../proc-stats.js'
import { type ScenarioGroup, mb, verdict } from '../report.js'
import { log, median, numberFromEnv, startSeeded } from '../servers.js'
import { runLoad } from '../wrk.js'

const DURATION_S = numberFromEnv('SOAK_DURATION', 600)
const WARMUP_S = numberFromEnv('SOAK_WARMUP', 30)
const RATE = numberFromEnv('SOAK_RATE', 200)
const CONNECTIONS = 20
const ROWS = 100
const MAX_GROWTH = 0.1
const SAMPLE_MS = 1000
/** RSS breathes with garbage collection: the start and the end are medians of a tenth of the samples each. */
const EDGE_SHARE = 0.1
const MIN_EDGE_SAMPLES = 5

export const soak: ScenarioGroup = {
  ids: ['soak'],
  run: async (postgres) => {
    const { server } = await startSeeded('service', postgres, ROWS, { label: 'soak' })
    const samples: number[] = []
    let timer: NodeJS.Timeout | undefined
    try {
      // Each connection waits before its next request: about RATE a second over all of them.
      const delayMs = RATE === 0 ? 0 : CONNECTIONS * 1000 / RATE
      const load = { connections: CONNECTIONS, durationS: DURATION_S, warmupS: WARMUP_S, delayMs }
      const result = await runLoad({ url: server.url, kind: 'mixed', ...load }, () => {
        log(`soak: warm-up over; measuring for ${DURATION_S} s`)
        resetPeakRss(server.pid)
        timer = setInterval(() => samples.push(rssBytes(server.pid)), SAMPLE_MS)
      })
      clearInterval(timer)
      const edge = Math.max(MIN_EDGE_SAMPLES, Math.floor(samples.length * EDGE_SHARE))
      const startRss = median(samples.slice(0, edge))
      const endRss = median(samples.slice(-edge))
      const growth = endRss / startRss - 1
      const grew = `${(growth * 100).toFixed(1)} %`
      const lines = [
        `${DURATION_S} s of 95 % GET and 5 % POST at about ${RATE} req/s over ${CONNECTIONS} connections, ` +
          `after ${WARMUP_S} s of warm-up`,
        '',
        `- requests: ${result.total} (${result.rps.toFixed(0)} req/s), p50 ${result.p50} ms, p99 ${result.p99} ms`,
        `- RSS: start ${mb(startRss)} MB, end ${mb(endRss)} MB, growth ${grew}, peak ${mb(peakRssBytes(server.pid))} MB`
      ]
      const verdicts = [
        verdict('soak', 'no failed request', String(result.failures), result.failures === 0),
        verdict('soak', `RSS growth < ${MAX_GROWTH * 100} %`, grew, growth < MAX_GROWTH)
      ]
      return { title: 'Soak', lines, verdicts }
    } finally {
      clearInterval(timer)
      await server.stop()
    }
  }
}
