/*
 * npm run soak: the mixed load (95% GET list, 5% POST) against the service
 * alone for SOAK_DURATION seconds (default 600), at a steady SOAK_RATE.
 * Reports the RSS at the start and at the end of the measured window and the
 * number of failed requests; exits non-zero when any request failed or the
 * RSS grew by 10% or more.
 *
 * Why a steady rate rather than as fast as possible: every POST adds a row,
 * and there is no delete. At full speed the table would grow by tens of
 * thousands of rows in ten minutes, and the soak would measure a growing
 * list (bigger responses, a bigger cached body) instead of a leak. At the
 * default 200 req/s the table grows by about 6,000 rows in ten minutes.
 */
import { execFileSync } from 'node:child_process'
import { rssBytes, watchPeakRss } from './proc-stats.js'
import { AUTH, ROOT, numberFromEnv, runToExit, seedRows, seedThroughApi, startLoadGenerator, startPostgres, startServer } from './servers.js'

const settings = {
  durationS: numberFromEnv('SOAK_DURATION', 600),
  warmupS: numberFromEnv('SOAK_WARMUP', 30),
  rate: numberFromEnv('SOAK_RATE', 200),
  connections: numberFromEnv('SOAK_CONNECTIONS', 20),
  seedRows: numberFromEnv('SOAK_ROWS', 100),
  logLevel: process.env.SOAK_LOG_LEVEL ?? 'info'
}
const MAX_GROWTH = 0.10

const log = (message: string): void => { process.stderr.write(`[soak] ${message}\n`) }
const mb = (bytes: number): string => (bytes / 2 ** 20).toFixed(1)

function median (values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.floor(sorted.length / 2)] ?? 0
}

async function rowCount (url: string): Promise<number> {
  const response = await fetch(`${url}/v1/categories`, { headers: AUTH })
  return (await response.json() as unknown[]).length
}

async function main (): Promise<number> {
  // npm run bench builds through its prebench script; the soak has none, so it builds here: it must run today's code.
  if (process.env.SOAK_SKIP_BUILD !== '1') execFileSync('npm', ['run', 'build'], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] })
  log(`SOAK_DURATION=${settings.durationS} SOAK_WARMUP=${settings.warmupS} SOAK_RATE=${settings.rate} SOAK_CONNECTIONS=${settings.connections} SOAK_ROWS=${settings.seedRows}`)
  const postgres = await startPostgres()
  // autocannon: it holds a steady request rate (wrk cannot).
  const load = await startLoadGenerator(log, 'autocannon')
  try {
    const server = await startServer('service', {
      databaseUrl: await postgres.createDatabase(`soak_${Date.now().toString(36)}`),
      logLevel: settings.logLevel,
      workDir: postgres.workDir,
      label: 'service-soak'
    })
    try {
      await seedThroughApi(server.url, seedRows(settings.seedRows))
      const samples: number[] = []
      let sampler: NodeJS.Timeout | undefined
      let peak: ReturnType<typeof watchPeakRss> | undefined
      const result = await load.run({
        url: server.url,
        kind: 'mixed',
        path: '/v1/categories',
        headers: AUTH,
        connections: settings.connections,
        durationS: settings.durationS,
        warmupS: settings.warmupS,
        rate: settings.rate,
        postEvery: 20,
        namePrefix: `soak-${Date.now().toString(36)}`
      }, () => {
        log(`warm-up over; measuring for ${settings.durationS} s`)
        peak = watchPeakRss(server.pid, 200)
        const began = Date.now()
        sampler = setInterval(() => {
          samples.push(rssBytes(server.pid))
          const elapsed = Math.round((Date.now() - began) / 1000)
          if (elapsed % 30 === 0) log(`${elapsed} s: RSS ${mb(samples.at(-1) ?? 0)} MB`)
        }, 1000)
      })
      clearInterval(sampler)
      const peakRss = peak?.stop() ?? 0
      // RSS breathes with garbage collection: compare the median of the first and the last tenth (at least 5 samples each).
      const window = Math.max(5, Math.floor(samples.length / 10))
      const startRss = median(samples.slice(0, window))
      const endRss = median(samples.slice(-window))
      const growth = startRss === 0 ? Number.POSITIVE_INFINITY : endRss / startRss - 1
      const failures = result.socketErrors + Object.entries(result.statusCounts)
        .filter(([code]) => !(Number(code) >= 200 && Number(code) < 300))
        .reduce((sum, [, count]) => sum + count, 0)
      const rows = await rowCount(server.url)
      const ok = failures === 0 && growth < MAX_GROWTH
      process.stdout.write([
        '',
        `soak: ${settings.durationS} s of mixed 95/5 load at ${settings.rate === 0 ? 'full speed' : `${settings.rate} req/s`} over ${settings.connections} connections, after ${settings.warmupS} s of warm-up`,
        `requests:   ${result.total} (${Math.round(result.rps)} req/s), p50 ${result.p50} ms, p99 ${result.p99} ms, statuses ${JSON.stringify(result.statusCounts)}`,
        `failures:   ${failures} (socket errors and timeouts ${result.socketErrors})`,
        `RSS:        start ${mb(startRss)} MB, end ${mb(endRss)} MB, growth ${(growth * 100).toFixed(1)}% (limit < ${MAX_GROWTH * 100}%), peak ${mb(peakRss)} MB`,
        `table:      ${settings.seedRows} rows at the start, ${rows} at the end`,
        `verdict:    ${ok ? 'PASS' : 'FAIL'}`,
        ''
      ].join('\n'))
      return ok ? 0 : 1
    } finally {
      await server.stop()
    }
  } finally {
    await load.stop()
    await postgres.stop()
  }
}

// The exit code is main()'s verdict (a FAIL is 1); a crash is 2.
await runToExit(main, 2)
