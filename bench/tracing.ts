/*
 * npm run bench:tracing: what tracing costs, in one run on one build. Four instances of the service
 * (npm start's command): tracing off, on with nothing sampled (always_off), on at 10 %
 * (parentbased_traceidratio 0.1) and on at 100 % (parentbased_always_on), exporting OTLP/HTTP
 * (protobuf) to bench/otlp-sink.ts, which drops what it gets. Each has its own database of 100
 * rows; wrk measures GET of the list and POST, in TRACING_ROUNDS interleaved rounds whose order
 * rotates; each instance's median round is reported, as a ratio to the untraced one's, in
 * requests per second and per CPU second of the service.
 */
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import pg from 'pg'
import { cpuSeconds } from './proc-stats.js'
import {
  AUTH, ROOT, numberFromEnv, runToExit, seedRows, seedThroughApi, startLoadGenerator, startPostgres, startServer, type RunningServer
} from './servers.js'
import { freePort } from '@petstore/embedded-postgres'

const settings = {
  durationS: numberFromEnv('TRACING_DURATION', 8),
  warmupS: numberFromEnv('TRACING_WARMUP', 2),
  rounds: Math.max(1, Math.round(numberFromEnv('TRACING_ROUNDS', 3))),
  connections: numberFromEnv('TRACING_CONNECTIONS', 50)
}
const log = (message: string): void => { process.stderr.write(`[tracing] ${message}\n`) }
const median = (values: number[]): number => [...values].sort((a, b) => a - b)[Math.floor((values.length - 1) / 2)] ?? 0

async function main (): Promise<void> {
  const load = await startLoadGenerator(log)
  const postgres = await startPostgres()
  const sinkPort = await freePort()
  const sink = spawn(process.execPath, ['--import', 'tsx', 'bench/otlp-sink.ts'], { cwd: ROOT, env: { ...process.env, OTLP_SINK_PORT: String(sinkPort) }, stdio: ['ignore', 'inherit', 'inherit'] })
  const traced = (sampler: string): string =>
    `OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:${sinkPort} OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf OTEL_TRACES_SAMPLER=${sampler}`
  const variants = [
    { label: 'off', env: '' },
    // What every request pays once tracing is on, before any is sampled: the decision, the hooks, no context entered.
    { label: 'none sampled', env: traced('always_off') },
    { label: '10 %', env: traced('parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=0.1') },
    { label: '100 %', env: traced('parentbased_always_on') }
  ]
  const servers: Array<{ label: string, server: RunningServer, databaseUrl: string }> = []
  const results = new Map<string, { rps: number[], perCpu: number[] }>()
  try {
    for (const [i, variant] of variants.entries()) {
      const databaseUrl = await postgres.createDatabase(`tracing_${Date.now().toString(36)}_${i}`)
      process.env.BENCH_SERVICE_ENV = variant.env
      const server = await startServer('service', { databaseUrl, logLevel: 'info', workDir: postgres.workDir, label: `tracing-${i}` })
      servers.push({ label: variant.label, server, databaseUrl })
      await seedThroughApi(server.url, seedRows(100))
      log(`${variant.label}: started and seeded (pid ${server.pid})`)
    }
    for (let round = 0; round < settings.rounds; round++) {
      for (const kind of ['get', 'post'] as const) {
        for (const { label, server, databaseUrl } of [...servers.slice(round % servers.length), ...servers.slice(0, round % servers.length)]) {
          let cpuAtStart = 0
          let startedAt = 0
          const spec = { url: server.url, kind, path: '/v1/categories', headers: AUTH, connections: settings.connections, durationS: settings.durationS }
          const result = await load.run({ ...spec, warmupS: settings.warmupS, rate: 0, postEvery: 20, namePrefix: `tracing-${round}-${label}` }, () => { cpuAtStart = cpuSeconds(server.pid); startedAt = performance.now() })
          const cpuShare = (cpuSeconds(server.pid) - cpuAtStart) / ((performance.now() - startedAt) / 1000)
          const key = `${kind} ${label}`
          const entry = results.get(key) ?? { rps: [], perCpu: [] }
          entry.rps.push(result.rps)
          entry.perCpu.push(result.rps / cpuShare)
          results.set(key, entry)
          log(`round ${round + 1} ${key}: ${Math.round(result.rps)} req/s, ${Math.round(result.rps / cpuShare)} per CPU s, statuses ${JSON.stringify(result.statusCounts)}`)
          if (kind === 'post') {
            const client = new pg.Client({ connectionString: databaseUrl })
            await client.connect()
            await client.query('DELETE FROM categories WHERE id > 100').finally(async () => { await client.end() })
          }
        }
      }
    }
  } finally {
    for (const { server } of servers) await server.stop()
    sink.kill('SIGTERM')
    await once(sink, 'exit')
    await load.stop()
    await postgres.stop()
  }
  const lines = [
    '| sampling | GET 100 rows: req/s (per CPU s) | × off | POST: req/s (per CPU s) | × off |',
    '|---|---:|---:|---:|---:|'
  ]
  for (const { label } of variants) {
    const cells = (['get', 'post'] as const).flatMap(kind => {
      const mine = results.get(`${kind} ${label}`) ?? { rps: [], perCpu: [] }
      const off = results.get(`${kind} off`) ?? { rps: [], perCpu: [] }
      return [`${Math.round(median(mine.rps)).toLocaleString('en')} (${Math.round(median(mine.perCpu)).toLocaleString('en')})`,
        `${(median(mine.rps) / median(off.rps)).toFixed(2)} (${(median(mine.perCpu) / median(off.perCpu)).toFixed(2)})`]
    })
    lines.push(`| ${label} | ${cells.join(' | ')} |`)
  }
  process.stdout.write(`${settings.rounds} rounds of ${settings.durationS} s (+${settings.warmupS} s warm-up), ${settings.connections} connections, median round\n${lines.join('\n')}\n`)
}

await runToExit(main)
