import type { ReadableSpan } from '@opentelemetry/sdk-trace'
import t from 'tap'
import { telemetryWanted } from '../src/telemetry.js'
import { traceInMemory } from './helpers/tracing.js'

/*
 * Tracing, with the SDK's in-memory exporter in place of OTLP (test/telemetry-otlp.test.ts
 * exports from a real process): the SDK starts before the app's modules are imported, as
 * `node --import ./dist/telemetry.js` does, and a request over a real socket makes the span
 * tree server request → Fastify → pg query, continues the caller's traceparent, and its
 * log line names the same trace.
 */

const exporter = await traceInMemory(t)
const { AUTH, json, listeningApp } = await import('./helpers/app.js')
const { testDatabase } = await import('./helpers/database.js')

const db = await testDatabase(t)
const { port, logs } = await listeningApp(t, db.url, { LOG_LEVEL: 'debug' })

const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736'
const CALLER_SPAN = '00f067aa0ba902b7'
const traceparent = (trace: string): string => `00-${trace}-${CALLER_SPAN}-01`

const spansOf = (traceId: string): ReadableSpan[] =>
  exporter.getFinishedSpans().filter(s => s.spanContext().traceId === traceId)
const parentOf = (span: ReadableSpan): string | undefined => span.parentSpanContext?.spanId
async function settled (traceId: string, count: (spans: ReadableSpan[]) => boolean): Promise<ReadableSpan[]> {
  for (let i = 0; i < 200 && !count(spansOf(traceId)); i++) await new Promise(resolve => setTimeout(resolve, 10))
  return spansOf(traceId)
}

t.test('on only when an exporter is configured, and never when disabled', async t => {
  t.notOk(telemetryWanted({}), 'nothing set: off')
  t.notOk(telemetryWanted({ OTEL_SERVICE_NAME: 'x', OTEL_TRACES_SAMPLER: 'always_on' }), 'no exporter: off')
  t.ok(telemetryWanted({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' }))
  t.ok(telemetryWanted({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://collector:4318/v1/traces' }))
  t.ok(telemetryWanted({ OTEL_TRACES_EXPORTER: 'console' }))
  t.notOk(telemetryWanted({ OTEL_TRACES_EXPORTER: 'none', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' }))
  t.notOk(telemetryWanted({ OTEL_SDK_DISABLED: 'true', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' }))
})

t.test("a request: server span → Fastify → pg queries, in the caller's trace, and its log line names it", async t => {
  const res = await fetch(`http://127.0.0.1:${port}/v1/categories`, {
    method: 'POST',
    headers: { ...json({}).headers, traceparent: traceparent(TRACE_ID), 'idempotency-key': 'traced-1' },
    body: JSON.stringify({ name: 'traced' })
  })
  t.equal(res.status, 201)
  const spans = await settled(
    TRACE_ID,
    s => s.some(span => span.kind === 1) && s.some(span => /^pg\.query/.test(span.name))
  )
  t.comment(spans.map(s => `${s.name} kind=${s.kind} parent=${parentOf(s) ?? '-'}`).join('\n'))

  const server = spans.find(s => s.kind === 1)
  if (server === undefined) throw new Error('no server span')
  t.equal(parentOf(server), CALLER_SPAN, 'the incoming traceparent is continued')
  t.equal(
    server.attributes['http.response.status_code'] ?? server.attributes['http.status_code'],
    201,
    'status on the server span'
  )
  t.equal(server.attributes['http.route'], '/v1/categories', 'route on the server span')
  t.equal(server.resource.attributes['service.name'], 'petstore', 'service.name defaults to petstore')

  const fastify = spans.find(s => s.instrumentationScope.name === '@fastify/otel' && s.name.startsWith('request'))
  t.ok(fastify, 'a Fastify request span')
  t.equal(fastify && parentOf(fastify), server.spanContext().spanId, 'under the server span')
  t.equal(fastify?.attributes['http.route'] ?? fastify?.attributes['fastify.route'] ?? undefined, '/v1/categories')

  const queries = spans.filter(s => /^pg\.query/.test(s.name))
  t.ok(queries.length > 0, "pg query spans in the request's trace")
  const byId = new Map(spans.map(s => [s.spanContext().spanId, s]))
  for (const query of queries) {
    let up: ReadableSpan | undefined = query
    while (up !== undefined && up !== server) up = byId.get(parentOf(up) ?? '')
    t.equal(up, server, `${query.name}: descends from the server span`)
    const text = String(query.attributes['db.query.text'] ?? query.attributes['db.statement'] ?? '')
    t.match(text, /\S/, `${query.name}: statement text`)
    t.notMatch(JSON.stringify(query.attributes), /traced-1|"traced"/, `${query.name}: no parameter values`)
  }
  for (const span of spans) t.notMatch(JSON.stringify(span.attributes), /test-key-0123456789/, `${span.name}: no key`)

  const line = logs.lines
    .map(l => JSON.parse(l) as Record<string, unknown>)
    .find(l => l.msg === 'request completed' && l.trace_id === TRACE_ID)
  t.ok(line, "the request's log line carries its trace_id")
  t.match(line?.span_id, /^[0-9a-f]{16}$/, 'and a span_id')
  t.ok(line !== undefined && byId.has(String(line.span_id)), 'of a span in that trace')
})

t.test('a query string is not recorded (it might hold a key)', async t => {
  const trace = 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1'
  await fetch(`http://127.0.0.1:${port}/v1/categories?api_key=secret-in-query`, {
    headers: { ...AUTH, traceparent: traceparent(trace) }
  })
  const spans = await settled(trace, s => s.some(span => span.kind === 1))
  t.ok(spans.length > 0)
  for (const span of spans) t.notMatch(JSON.stringify(span.attributes), /secret-in-query/, span.name)
})

t.test("the balancer's probes are not traced", async t => {
  const trace = 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb2'
  t.equal(
    (await fetch(`http://127.0.0.1:${port}/health/live`, { headers: { traceparent: traceparent(trace) } })).status,
    200
  )
  await new Promise(resolve => setTimeout(resolve, 100))
  t.same(
    spansOf(trace).map(s => s.name),
    []
  )
})
