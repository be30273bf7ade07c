import { subscribe } from 'node:diagnostics_channel'
import { context, propagation, trace, ROOT_CONTEXT, SpanKind, SpanStatusCode, type Span } from '@opentelemetry/api'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import type { NodeSDK } from '@opentelemetry/sdk-node'
import type { SpanProcessor } from '@opentelemetry/sdk-trace'

// Loaded with `node --import ./dist/telemetry.js` so that pg and ioredis are instrumented before they are imported.
// Off, with nothing of the SDK loaded, unless an OTEL_* variable configures an exporter.
export function telemetryWanted (env: Record<string, string | undefined> = process.env): boolean {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === 'true') return false
  const set = (name: string): boolean => (env[name]?.trim() ?? '') !== ''
  if (set('OTEL_TRACES_EXPORTER')) return env.OTEL_TRACES_EXPORTER?.trim() !== 'none'
  return set('OTEL_EXPORTER_OTLP_ENDPOINT') || set('OTEL_EXPORTER_OTLP_TRACES_ENDPOINT')
}

// Requests nobody follows a trace for: the balancer's probes and the metrics scrape.
const isProbe = (url: string | undefined): boolean => url === '/metrics' || (url?.startsWith('/health/') ?? false)

/**
 * Each request's server span, made in the first onRequest hook under an incoming traceparent. A request the sampler
 * leaves out runs with no span in its context, so @fastify/otel, pg and ioredis (requireParentSpan) skip it.
 */
function traceServerSpans ({ setRPCMetadata, RPCType }: typeof import('@opentelemetry/core')): void {
  const tracer = trace.getTracer('petstore')
  const spans = new WeakMap<FastifyRequest, Span>()
  subscribe('fastify.initialization', message => {
    const { fastify } = message as { fastify: FastifyInstance }
    fastify.addHook('onRequest', (request, _reply, done) => {
      const parent = propagation.extract(ROOT_CONTEXT, request.headers)
      const kind = SpanKind.SERVER
      const span = isProbe(request.url) ? undefined : tracer.startSpan(request.method, { kind }, parent)
      if (span?.isRecording() !== true) {
        done()
        return
      }
      const route = request.routeOptions.url
      if (route !== undefined) span.updateName(`${request.method} ${route}`)
      const query = request.url.indexOf('?')
      span.setAttributes({
        'http.request.method': request.method,
        'url.path': query < 0 ? request.url : request.url.slice(0, query),
        // The API takes no query string; one sent anyway might hold a key, as the log lines assume.
        ...(query < 0 ? {} : { 'url.query': '[redacted]' }),
        ...(route === undefined ? {} : { 'http.route': route }),
        'client.address': request.ip
      })
      spans.set(request, span)
      // The RPC metadata tells @fastify/otel a server span exists, so its request span is an internal one under it.
      context.with(setRPCMetadata(trace.setSpan(parent, span), { type: RPCType.HTTP, span }), done)
    })
    fastify.addHook('onResponse', (request, reply, done) => {
      const span = spans.get(request)
      span?.setAttribute('http.response.status_code', reply.statusCode)
      if (reply.statusCode >= 500) span?.setStatus({ code: SpanStatusCode.ERROR })
      span?.end()
      done()
    })
  })
}

export async function startTelemetry (options: { spanProcessors?: SpanProcessor[] } = {}): Promise<NodeSDK> {
  // ESM: `import` of a CommonJS package (ioredis) bypasses require hooks; import-in-the-middle's loader lets the
  // instrumentations wrap it, and (through the message channel) only the modules they hook.
  const { register } = await import('node:module')
  const { createAddHookMessageChannel } = await import('import-in-the-middle')
  const { registerOptions, waitForAllMessagesAcknowledged } = createAddHookMessageChannel()
  register('import-in-the-middle/hook.mjs', import.meta.url, registerOptions)
  const [{ NodeSDK }, { PgInstrumentation }, { IORedisInstrumentation }, { FastifyOtelInstrumentation }, core] =
    await Promise.all([
      import('@opentelemetry/sdk-node'),
      import('@opentelemetry/instrumentation-pg'),
      import('@opentelemetry/instrumentation-ioredis'),
      import('@fastify/otel'),
      import('@opentelemetry/core')
    ])
  traceServerSpans(core) // before @fastify/otel subscribes to the same channel: the server span's hook runs first
  const { OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES } = process.env
  const namedElsewhere = (OTEL_SERVICE_NAME ?? '') !== '' ||
    /(^|,)\s*service\.name\s*=/.test(OTEL_RESOURCE_ATTRIBUTES ?? '')
  const sdk = new NodeSDK({
    serviceName: namedElsewhere ? undefined : 'petstore',
    spanProcessors: options.spanProcessors, // the exporter's stand-in in tests
    metricReaders: [], // traces only: the SDK's default OTLP metrics cost a histogram update per query
    instrumentations: [
      // Statement text only (enhancedDatabaseReporting off: no parameter values), and only inside a request.
      new PgInstrumentation({ requireParentSpan: true, enhancedDatabaseReporting: false }),
      // Command names only: the default would record EVALSHA's arguments, the rate-limit keys (client addresses).
      new IORedisInstrumentation({ requireParentSpan: true, dbStatementSerializer: (command: string) => command }),
      new FastifyOtelInstrumentation({
        registerOnInitialization: true,
        // A span per hook would be most of the spans, and of their cost (docs/performance.md), and say little.
        instrumentHooks: false,
        // Asked per route ({ handler, … }) and per request ({ url, method }): not for a request without a server span.
        ignorePaths: (route: { url: string, handler?: unknown }) =>
          isProbe(route.url) || (route.handler === undefined && trace.getActiveSpan() === undefined),
        requestHook: (span, request) => {
          if (request.url.includes('?')) span.setAttribute('url.path', request.url.split('?')[0] ?? '')
        }
      })
    ]
  })
  sdk.start()
  await waitForAllMessagesAcknowledged()
  return sdk
}

export const telemetry = telemetryWanted() ? await startTelemetry() : undefined
