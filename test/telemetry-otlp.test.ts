import { createServer, type IncomingMessage } from 'node:http'
import t, { type Test } from 'tap'
import { TEST_KEY } from './helpers/app.js'
import { testDatabase } from './helpers/database.js'
import { freePort } from './helpers/ports.js'
import { startServer, type ServerProcess } from './helpers/server-process.js'
import { until } from './helpers/until.js'

/*
 * The built service as npm start runs it (`node <flags> --import ./dist/telemetry.js
 * dist/server.js`), exporting OTLP over HTTP to a receiver this test starts on
 * loopback, in both protocols: the caller's traceparent is continued, the spans
 * arrive, and the request's log line names the same trace. Without OTEL_* set,
 * nothing is sent.
 */

t.setTimeout(240000)
const db = await testDatabase(t)
/** The batch exporter sends every few seconds; each look parses every export so far. */
const SPANS_ARRIVE_MS = 15_000
const SPANS_POLL_MS = 50

interface Export {
  path: string
  contentType: string
  body: Buffer
}

/** An OTLP/HTTP receiver: every POST is kept and answered 200 with an empty response message. */
async function receiver (t: Test): Promise<{ url: string; received: Export[] }> {
  const received: Export[] = []
  const server = createServer((req: IncomingMessage, res) => {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', () => {
      const contentType = req.headers['content-type'] ?? ''
      received.push({ path: req.url ?? '', contentType, body: Buffer.concat(chunks) })
      res.writeHead(200, { 'content-type': contentType }).end(contentType.includes('json') ? '{}' : '')
    })
  })
  const port = await freePort()
  await new Promise<void>(resolve => server.listen(port, '127.0.0.1', resolve))
  t.teardown(() => {
    server.close()
  })
  return { url: `http://127.0.0.1:${port}`, received }
}

async function service (t: Test, env: Record<string, string>): Promise<ServerProcess> {
  return await startServer(t, { DATABASE_URL: db.url, API_KEYS: TEST_KEY, LOG_LEVEL: 'debug', ...env })
}

async function tracedCreate (server: ServerProcess, traceId: string): Promise<void> {
  const res = await fetch(`http://127.0.0.1:${server.port}/v1/categories`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${TEST_KEY}`,
      'content-type': 'application/json',
      traceparent: `00-${traceId}-00f067aa0ba902b7-01`
    },
    body: JSON.stringify({ name: `otlp-${traceId.slice(0, 6)}` })
  })
  if (res.status !== 201) throw new Error(`create answered ${res.status}`)
}

function logLineOf (server: ServerProcess, traceId: string): Record<string, unknown> | undefined {
  return server
    .output()
    .split('\n')
    .filter(l => l.startsWith('{'))
    .map(l => JSON.parse(l) as Record<string, unknown>)
    .find(l => l.msg === 'request completed' && l.trace_id === traceId)
}

t.test("http/json: the spans of a request arrive, in the caller's trace", async t => {
  const otlp = await receiver(t)
  const server = await service(t, {
    OTEL_EXPORTER_OTLP_ENDPOINT: otlp.url,
    OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
    OTEL_BSP_SCHEDULE_DELAY: '100'
  })
  const traceId = '11111111111111111111111111111111'.replace(/^1/, 'a')
  await tracedCreate(server, traceId)
  type JsonSpan = {
    traceId: string
    name: string
    kind: number
    attributes: Array<{ key: string; value: Record<string, unknown> }>
  }
  const spans = (): JsonSpan[] =>
    otlp.received
      .filter(e => e.path === '/v1/traces')
      .flatMap(e => {
        const body = JSON.parse(e.body.toString()) as {
          resourceSpans: Array<{
            resource: { attributes: Array<{ key: string; value: { stringValue?: string } }> }
            scopeSpans: Array<{ spans: JsonSpan[] }>
          }>
        }
        for (const rs of body.resourceSpans) {
          t.equal(
            rs.resource.attributes.find(a => a.key === 'service.name')?.value.stringValue,
            'petstore',
            'service.name'
          )
        }
        return body.resourceSpans.flatMap(rs => rs.scopeSpans.flatMap(ss => ss.spans))
      })
      .filter(s => s.traceId === traceId)
  await until(
    'the server span and a pg query arrive',
    async () => spans().some(s => s.kind === 2) && spans().some(s => s.name.startsWith('pg.query')),
    SPANS_ARRIVE_MS,
    SPANS_POLL_MS
  )
  t.ok(
    otlp.received.every(e => e.contentType === 'application/json'),
    'sent as JSON'
  )
  t.ok(
    spans().some(s => s.name === 'POST /v1/categories' && s.kind === 2),
    'the server span (kind SERVER)'
  )
  t.ok(
    spans().some(s => s.name === 'request'),
    'the Fastify request span'
  )
  const statement = (s: JsonSpan): string =>
    String(s.attributes.find(a => a.key === 'db.query.text')?.value.stringValue ?? '')
  t.ok(
    spans().some(s => s.name.startsWith('pg.query:') && /\bINSERT INTO categories\b/.test(statement(s))),
    'the INSERT, with its statement text'
  )
  t.notMatch(
    JSON.stringify(spans()),
    new RegExp(`${TEST_KEY}|otlp-${traceId.slice(0, 6)}`),
    'neither the key nor parameter values'
  )
  t.ok(logLineOf(server, traceId), "the request's log line carries the trace_id")
})

t.test('http/protobuf: the same, and the last spans are flushed on SIGTERM', async t => {
  const otlp = await receiver(t)
  // Batches every minute: only the shutdown's flush can deliver this request's spans in time.
  const server = await service(t, {
    OTEL_EXPORTER_OTLP_ENDPOINT: otlp.url,
    OTEL_EXPORTER_OTLP_PROTOCOL: 'http/protobuf',
    OTEL_BSP_SCHEDULE_DELAY: '60000',
    OTEL_SERVICE_NAME: 'petstore-protobuf'
  })
  const traceId = 'b2222222222222222222222222222222'
  await tracedCreate(server, traceId)
  t.equal(otlp.received.length, 0, 'nothing sent before the batch is due')
  server.child.kill('SIGTERM')
  t.equal(await server.exited, 0)
  const traces = otlp.received.filter(e => e.path === '/v1/traces')
  t.ok(traces.length > 0, 'the spans were flushed on shutdown')
  t.ok(
    traces.every(e => e.contentType === 'application/x-protobuf'),
    'sent as protobuf'
  )
  const body = Buffer.concat(traces.map(e => e.body))
  // In protobuf the trace id is its 16 bytes, and names and attribute values are plain UTF-8.
  t.ok(body.includes(Buffer.from(traceId, 'hex')), "spans of the caller's trace")
  for (const text of ['POST /v1/categories', 'pg.query:', 'INSERT INTO categories', 'petstore-protobuf']) {
    t.ok(body.includes(text), `contains ${text}`)
  }
  t.notOk(body.includes(TEST_KEY), 'not the key')
  t.ok(logLineOf(server, traceId), "the request's log line carries the trace_id")
})

t.test('without OTEL_* nothing is exported and log lines have no trace_id', async t => {
  const otlp = await receiver(t)
  const server = await service(t, { OTEL_SERVICE_NAME: 'unused', OTEL_TRACES_SAMPLER: 'always_on' })
  await tracedCreate(server, 'c3333333333333333333333333333333')
  await new Promise(resolve => setTimeout(resolve, 300))
  t.equal(otlp.received.length, 0)
  t.notMatch(server.output(), /trace_id/)
})
