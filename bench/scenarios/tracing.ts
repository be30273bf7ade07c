/*
 * tracing: four instances of this build in one run, tracing off, on with nothing sampled (always_off: what every
 * request pays for the decision and the hooks), at 10 % and at 100 %, exporting OTLP/HTTP to a receiver in this
 * process that drops what it gets. GET of the 100-row list and POST, interleaved rounds whose order rotates; each
 * instance's median round, in requests per second and per CPU second, over the untraced instance's.
 */
import { once } from 'node:events'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { cpuSeconds } from '../proc-stats.js'
import { type ScenarioGroup, ratioText, rotate, settings } from '../report.js'
import { type RunningServer, log, median, restoreTable, startSeeded } from '../servers.js'
import { runLoad } from '../wrk.js'

const ROWS = 100
const TARGETS = [{ variant: '10 %', min: 0.9 }, { variant: '100 %', min: 0.6 }]
const KINDS = ['get', 'post'] as const
const TEN_PERCENT = { OTEL_TRACES_SAMPLER: 'parentbased_traceidratio', OTEL_TRACES_SAMPLER_ARG: '0.1' }

export const tracing: ScenarioGroup = {
  ids: ['tracing'],
  byDefault: false,
  run: async ({ postgres, runId }) => {
    const { durationS, warmupS, rounds, connections } = settings({ rounds: 3, durationS: 8, warmupS: 2 })
    const sink = createServer((request, response) => {
      request.resume()
      request.on('end', () => { response.writeHead(200).end() })
    })
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
    const results = new Map<string, { rps: number[], perCpu: number[] }>()
    try {
      for (const [i, variant] of variants.entries()) {
        const options = { label: `tracing-${i}`, database: `tracing_${runId}_${i}`, env: variant.env }
        const { server, databaseUrl } = await startSeeded('service', postgres, ROWS, options)
        running.push({ label: variant.label, server, databaseUrl: databaseUrl as string })
      }
      for (let round = 0; round < rounds; round++) {
        for (const kind of KINDS) {
          for (const { label, server, databaseUrl } of rotate(running, round)) {
            let cpuBefore = 0
            const spec = { url: server.url, kind, connections, durationS, warmupS, namePrefix: `tracing-${round}` }
            const result = await runLoad(spec, () => {
              cpuBefore = cpuSeconds(server.pid)
            })
            const entry = results.get(`${kind} ${label}`) ?? { rps: [], perCpu: [] }
            entry.rps.push(result.rps)
            entry.perCpu.push(result.total / (cpuSeconds(server.pid) - cpuBefore))
            results.set(`${kind} ${label}`, entry)
            log(`tracing round ${round + 1}, ${kind} ${label}: ${result.rps.toFixed(0)} req/s`)
            if (kind === 'post') await restoreTable(databaseUrl, ROWS)
          }
        }
      }
    } finally {
      for (const { server } of running) await server.stop()
      sink.close()
    }
    const over = (kind: string, label: string, metric: 'rps' | 'perCpu'): number =>
      median(results.get(`${kind} ${label}`)?.[metric] ?? []) / median(results.get(`${kind} off`)?.[metric] ?? [])
    const lines = [
      `${rounds} rounds of ${durationS} s after ${warmupS} s of warm-up, ${connections} connections; req/s (per CPU ` +
        'second) of the median round, and over the untraced instance\'s',
      '',
      '| sampling | GET 100 rows | × off | POST | × off |',
      '|---|---:|---:|---:|---:|',
      ...variants.map(({ label }) => `| ${label} | ${KINDS.map(kind => {
        const entry = results.get(`${kind} ${label}`) ?? { rps: [], perCpu: [] }
        const rates = `${median(entry.rps).toFixed(0)} (${median(entry.perCpu).toFixed(0)})`
        return `${rates} | ${ratioText(over(kind, label, 'rps'))} (${ratioText(over(kind, label, 'perCpu'))})`
      }).join(' | ')} |`)
    ]
    const verdicts = TARGETS.flatMap(({ variant, min }) => KINDS.map(kind => ({
      scenario: `tracing, ${kind.toUpperCase()}`,
      target: `sampling ${variant} ≥ ${min} × off`,
      measured: ratioText(over(kind, variant, 'rps')),
      met: over(kind, variant, 'rps') >= min
    })))
    return [{ title: 'Tracing on against off', lines, verdicts }]
  }
}
