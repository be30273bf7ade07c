import type { ReadableSpan } from '@opentelemetry/sdk-trace'
import t from 'tap'
import { traceInMemory } from './helpers/tracing.js'

/*
 * Sampling, as production runs it (parentbased_traceidratio): the decision made for the server span
 * is the request's. A request left out makes no span at all (not Fastify's, not pg's: none decides
 * again on its own), and its log lines name no trace; one taken in makes the whole tree. An incoming
 * traceparent's sampled flag wins over the ratio, either way.
 */

process.env.OTEL_TRACES_SAMPLER = 'parentbased_traceidratio'
process.env.OTEL_TRACES_SAMPLER_ARG = '0.5'
const exporter = await traceInMemory(t)
const { AUTH, json, listeningApp } = await import('./helpers/app.js')
const { testDatabase } = await import('./helpers/database.js')

const db = await testDatabase(t)
const { port, logs } = await listeningApp(t, db.url, { LOG_LEVEL: 'debug' })
const CALLER_SPAN = '00f067aa0ba902b7'
const SERVER = 1

async function quiet (): Promise<void> {
  await new Promise(resolve => setTimeout(resolve, 300))
}
function byTrace (): Map<string, ReadableSpan[]> {
  const traces = new Map<string, ReadableSpan[]>()
  for (const span of exporter.getFinishedSpans()) {
    const traceId = span.spanContext().traceId
    traces.set(traceId, [...(traces.get(traceId) ?? []), span])
  }
  return traces
}
const completed = (): Array<Record<string, unknown>> =>
  logs.lines.map(l => JSON.parse(l) as Record<string, unknown>).filter(l => l.msg === 'request completed')

t.test('a request is traced whole or not at all, by one decision; unsampled ones write no trace id', async t => {
  exporter.reset()
  const before = completed().length
  for (let i = 0; i < 40; i++) {
    const res =
      i % 4 === 0
        ? await fetch(`http://127.0.0.1:${port}/v1/categories`, {
          method: 'POST',
          headers: { ...json({}).headers, 'idempotency-key': `sampling-${i}` },
          body: JSON.stringify({ name: `sampled ${i}` })
        })
        : await fetch(`http://127.0.0.1:${port}/v1/categories`, { headers: AUTH })
    await res.arrayBuffer()
  }
  await quiet()
  const traces = byTrace()
  t.ok(traces.size > 0 && traces.size < 40, `some requests sampled, some not (${traces.size} of 40)`)
  for (const [traceId, spans] of traces) {
    const server = spans.filter(s => s.kind === SERVER)
    t.same(
      server.map(s => s.name),
      [spans.some(s => s.name.startsWith('pg.query:INSERT')) ? 'POST /v1/categories' : 'GET /v1/categories'],
      `${traceId}: one server span`
    )
    t.ok(
      spans.some(s => s.name === 'request') && spans.some(s => s.name.startsWith('handler')),
      `${traceId}: with Fastify's request and handler spans`
    )
    t.equal(server[0]?.parentSpanContext, undefined, `${traceId}: the server span is the root`)
  }
  const lines = completed().slice(before)
  t.equal(lines.length, 40)
  t.equal(
    lines.filter(l => l.trace_id !== undefined).length,
    traces.size,
    'a trace id in the log line of each sampled request, none in the others'
  )
  for (const line of lines) {
    if (line.trace_id !== undefined) t.ok(traces.has(String(line.trace_id)), 'of a sampled trace')
  }
})

t.test('an incoming traceparent decides: sampled is traced, unsampled is not, whatever the ratio', async t => {
  exporter.reset()
  const ids = Array.from({ length: 8 }, (_, i) => `${String(i + 1).repeat(2)}${'0'.repeat(29)}${i + 1}`)
  for (const [i, traceId] of ids.entries()) {
    const res = await fetch(`http://127.0.0.1:${port}/v1/categories`, {
      headers: { ...AUTH, traceparent: `00-${traceId}-${CALLER_SPAN}-0${i % 2}` }
    })
    await res.arrayBuffer()
  }
  await quiet()
  const traces = byTrace()
  t.same(
    [...traces.keys()].sort(),
    ids.filter((_, i) => i % 2 === 1).sort(),
    'exactly the requests whose caller sampled them'
  )
  for (const spans of traces.values()) {
    const server = spans.find(s => s.kind === SERVER)
    t.equal(server?.parentSpanContext?.spanId, CALLER_SPAN, "the server span continues the caller's")
    t.equal(server?.attributes['http.route'], '/v1/categories')
  }
})
