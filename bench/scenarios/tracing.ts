/*
 * tracing: four instances, tracing off, on with nothing sampled (always_off: what every request pays for the
 * decision and the hooks), at 10 % and at 100 %, exporting OTLP/HTTP to a receiver here that drops what it gets.
 */
import { once } from 'node:events'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { cpuSeconds } from '../proc-stats.js'
import { type ScenarioGroup, header, ratioText, rotate, row, verdict } from '../report.js'
import { type RunningServer, log, median, restoreTable, startSeeded } from '../servers.js'
import { runLoad, settings } from '../wrk.js'

const ROWS = 100
const TARGETS = [{ variant: '10 %', min: 0.9 }, { variant: '100 %', min: 0.6 }]
const KINDS = ['get', 'post'] as const
const TEN_PERCENT = { OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.1' }

export const tracing: ScenarioGroup = {
  ids: ['tracing'],
  run: async (postgres) => {
    const { durationS, warmupS, rounds, connections } = settings({ rounds: 3, durationS: 8, warmupS: 2 })
    const sink = createServer((request, response) => request.resume().on('end', () => response.end()))
    await once(sink.listen(0, '127.0.0.1'), 'listening')
    const exporting = {
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${(sink.address() as AddressInfo).port}`,
      OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf'
    }
    const variants = [
      { label: 'off', env: {} },
      { label: 'none sampled', env: { ...exporting, OTEL_TRACES_SAMPLER: 'always_off' } },
      { label: '10 %', env: { ...exporting, ...TEN_PERCENT } },
      { label: '100 %', env: { ...exporting, OTEL_TRACES_SAMPLER: 'parentbased_always_on' } }
    ]
    const running: Array<{ label: string, server: RunningServer, databaseUrl: string }> = []
    const rates = new Map<string, Array<{ rps: number, perCpu: number }>>()
    try {
      for (const [i, { label, env }] of variants.entries()) {
        running.push({ label, ...await startSeeded('service', postgres, ROWS, { label: `tracing-${i}`, env }) })
      }
      for (let round = 0; round < rounds; round++) {
        for (const kind of KINDS) {
          for (const { label, server, databaseUrl } of rotate(running, round)) {
            let cpuBefore = 0
            const spec = { url: server.url, kind, connections, durationS, warmupS }
            const result = await runLoad(spec, () => { cpuBefore = cpuSeconds(server.pid) })
            const perCpu = result.total / (cpuSeconds(server.pid) - cpuBefore)
            rates.set(`${kind} ${label}`, [...rates.get(`${kind} ${label}`) ?? [], { rps: result.rps, perCpu }])
            log(`tracing round ${round + 1}, ${kind} ${label}: ${result.rps.toFixed(0)} req/s`)
            if (kind === 'post') await restoreTable(databaseUrl, ROWS)
          }
        }
      }
    } finally {
      for (const { server } of running) await server.stop()
      sink.close()
    }
    const rate = (kind: string, label: string, metric: 'rps' | 'perCpu'): number =>
      median(rates.get(`${kind} ${label}`)?.map(r => r[metric]) ?? [])
    const over = (kind: string, label: string, metric: 'rps' | 'perCpu'): string =>
      ratioText(rate(kind, label, metric) / rate(kind, 'off', metric))
    const cells = (kind: string, label: string): string[] => [
      `${rate(kind, label, 'rps').toFixed(0)} (${rate(kind, label, 'perCpu').toFixed(0)})`,
      `${over(kind, label, 'rps')} (${over(kind, label, 'perCpu')})`
    ]
    const lines = [
      `${rounds} rounds of ${durationS} s after ${warmupS} s of warm-up, ${connections} connections; req/s (per CPU ` +
        'second) of the median round, and over the untraced instance\'s',
      '',
      ...header(['sampling', 'GET 100 rows', '× off', 'POST', '× off']),
      ...variants.map(({ label }) => row([label, ...KINDS.flatMap(kind => cells(kind, label))]))
    ]
    const verdicts = TARGETS.flatMap(({ variant, min }) => KINDS.map(kind => {
      const met = rate(kind, variant, 'rps') >= min * rate(kind, 'off', 'rps')
      return verdict(`tracing, ${kind}`, `sampling ${variant} ≥ ${min} × off`, over(kind, variant, 'rps'), met)
    }))
    return { title: 'Tracing on against off', lines, verdicts }
  }
}
