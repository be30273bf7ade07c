/*
 * Managed keys against a static one: GET list (100 rows) on one service instance, in windows that alternate
 * between a static key (API_KEYS) and a managed key (npm run keys), so both meet the same machine load. The
 * managed key must cost no database round trip: target ≥ 0.95 × the static key's rate. On a shared machine the
 * rate moves with other work, so the run also reports requests per CPU second of the service process.
 */
import { execFileSync } from 'node:child_process'
import os from 'node:os'
import path from 'node:path'
import { cpuSeconds } from './proc-stats.js'
import { AUTH, median, numberFromEnv, runToExit, seedBySql, startLoadGenerator, startPostgres, startServer } from './servers.js'

const settings = {
  rounds: numberFromEnv('KEYS_ROUNDS', 8),
  durationS: numberFromEnv('KEYS_DURATION', 4),
  warmupS: numberFromEnv('KEYS_WARMUP', 1),
  connections: numberFromEnv('KEYS_CONNECTIONS', 50)
}

function log (message: string): void {
  process.stderr.write(`[keys ${new Date().toISOString().slice(11, 19)}] ${message}\n`)
}

async function main (): Promise<void> {
  const load = await startLoadGenerator(log)
  const postgres = await startPostgres()
  const databaseUrl = await postgres.createDatabase(`keys_${Date.now().toString(36)}`)
  const server = await startServer('service', { databaseUrl, logLevel: 'info', workDir: postgres.workDir, label: 'keys-service' })
  const rates: Record<'static' | 'managed', number[]> = { static: [], managed: [] }
  const perCpu: Record<'static' | 'managed', number[]> = { static: [], managed: [] }
  try {
    await seedBySql(databaseUrl, 100)
    const output = execFileSync(process.execPath, [path.join(import.meta.dirname, '..', 'dist', 'keys', 'command.js'), 'create', '--name', 'bench', '--scope', 'read'],
      { env: { PATH: process.env.PATH, DATABASE_URL: databaseUrl }, encoding: 'utf8' })
    const managed = { authorization: `Bearer ${output.trimEnd().split('\n').at(-1) ?? ''}` }
    const headers = { static: AUTH, managed }
    for (let round = 0; round < settings.rounds; round++) {
      // Each round in the other order: neither key always runs first.
      const order = round % 2 === 0 ? ['static', 'managed'] as const : ['managed', 'static'] as const
      for (const key of order) {
        const cpuBefore = cpuSeconds(server.pid)
        const result = await load.run({
          url: server.url,
          kind: 'get',
          path: '/v1/categories',
          headers: headers[key],
          connections: settings.connections,
          durationS: settings.durationS,
          warmupS: settings.warmupS,
          rate: 0,
          postEvery: 0,
          namePrefix: 'keys'
        }, () => {})
        const failures = result.socketErrors + (result.statusCounts['4xx-5xx'] ?? 0)
        if (failures > 0) throw new Error(`${key} key: ${failures} failed requests (${JSON.stringify(result.statusCounts)})`)
        // The CPU of the warm-up too, for both keys alike.
        const cpu = cpuSeconds(server.pid) - cpuBefore
        rates[key].push(result.rps)
        perCpu[key].push(result.rps * (settings.durationS + settings.warmupS) / cpu)
        log(`round ${round + 1}, ${key} key: ${result.rps.toFixed(0)} req/s, p99 ${result.p99} ms, ${perCpu[key].at(-1)?.toFixed(0)} per CPU second`)
      }
    }
  } finally {
    await server.stop()
    await load.stop()
    await postgres.stop()
  }
  const ratiosOf = (values: typeof rates): number[] => values.managed.map((rate, i) => rate / (values.static[i] ?? rate))
  const ratios = ratiosOf(rates)
  const ratio = median(ratios)
  const cpuRatios = ratiosOf(perCpu)
  process.stdout.write([
    `GET list (100 rows), ${settings.rounds} rounds of ${settings.durationS} s per key after ${settings.warmupS} s warm-up, ` +
      `${settings.connections} connections, ${os.availableParallelism()} cores, load average ${os.loadavg().map(l => l.toFixed(1)).join(' ')}`,
    '',
    '| key | req/s per round | median |',
    '|---|---|---:|',
    ...(['static', 'managed'] as const).map(key => `| ${key} | ${rates[key].map(r => r.toFixed(0)).join(', ')} | ${median(rates[key]).toFixed(0)} |`),
    ...(['static', 'managed'] as const).map(key => `| ${key}, per CPU second | ${perCpu[key].map(r => r.toFixed(0)).join(', ')} | ${median(perCpu[key]).toFixed(0)} |`),
    '',
    `managed / static, median of the rounds' ratios: ${ratio.toFixed(3)} (per round: ${ratios.map(r => r.toFixed(3)).join(', ')}); ` +
      `target ≥ 0.95: ${ratio >= 0.95 ? 'met' : 'not met'}`,
    `per CPU second of the service: ${median(cpuRatios).toFixed(3)} (per round: ${cpuRatios.map(r => r.toFixed(3)).join(', ')})`
  ].join('\n') + '\n')
}

await runToExit(main)
