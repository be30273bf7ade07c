import { subscribe } from 'node:diagnostics_channel'
import { context, propagation, trace, ROOT_CONTEXT, SpanKind, SpanStatusCode, type Span } from '@opentelemetry/api'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import type { SpanProcessor } from '@opentelemetry/sdk-trace'

/**
 * OpenTelemetry tracing, configured only by the standard OTEL_* variables. Loaded before the service
 * (`node --import ./dist/telemetry.js dist/server.js`, as npm start and the image run it) so that pg and ioredis are
 * instrumented before they are imported; Fastify, on every instance, through its initialization diagnostics channel.
 * Off (nothing of the SDK loaded) unless an exporter is configured: OTEL_EXPORTER_OTLP_ENDPOINT,
 * OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_TRACES_EXPORTER; OTEL_SDK_DISABLED=true turns it off whatever else is set.
 */

type Env = Record<string, string | undefined>

export function telemetryWanted (env: Env = process.env): boolean {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === 'true') return false
  const set = (name: string): boolean => (env[name]?.trim() ?? '') !== ''
  if (set('OTEL_TRACES_EXPORTER')) return env.OTEL_TRACES_EXPORTER?.trim() !== 'none'
  return set('OTEL_EXPORTER_OTLP_ENDPOINT') || set('OTEL_EXPORTER_OTLP_TRACES_ENDPOINT')
}

/** Requests nobody follows a trace for: the balancer's probes and the metrics scrape. */
function isProbe (url: string | undefined): boolean {
  return url === '/metrics' || (url?.startsWith('/health/') ?? false)
}

export interface Telemetry { shutdown: () => Promise<void> }

/**
 * The server span of every request to every Fastify instance, made in its first onRequest hook, under an incoming
 * traceparent; the rest of the request runs in its context. A request the sampler leaves out runs with no span in
 * its context, so @fastify/otel (ignorePaths below), pg and ioredis (requireParentSpan) do nothing for it.
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
      if (span?.isRecording() !== true) { done(); return }
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

/** Starts the SDK as OTEL_* says (service.name: petstore by default); `spanProcessors` replace the exporter (tests). */
export async function startTelemetry (options: { spanProcessors?: SpanProcessor[] } = {}): Promise<Telemetry> {
  // ESM: `import` of a CommonJS package (ioredis) bypasses require hooks; import-in-the-middle's loader lets the
  // instrumentations wrap it, and (through the message channel) only the modules they hook.
  const { register } = await import('node:module')
  const { createAddHookMessageChannel } = await import('import-in-the-middle')
  const { registerOptions, waitForAllMessagesAcknowledged } = createAddHookMessageChannel()
  register('import-in-the-middle/hook.mjs', import.meta.url, registerOptions)
  const modules = await Promise.all([
    import('@opentelemetry/sdk-node'),
    import('@opentelemetry/instrumentation-pg'),
    import('@opentelemetry/instrumentation-ioredis'),
    import('@fastify/otel'),
    import('@opentelemetry/core')
  ])
  const [{ NodeSDK }, { PgInstrumentation }, { IORedisInstrumentation }, { FastifyOtelInstrumentation }, core] = modules
  traceServerSpans(core) // before @fastify/otel subscribes to the same channel: the server span's hook runs first
  const env = process.env
  const namedElsewhere = (env.OTEL_SERVICE_NAME ?? '') !== '' ||
    /(^|,)\s*service\.name\s*=/.test(env.OTEL_RESOURCE_ATTRIBUTES ?? '')
  const sdk = new NodeSDK({
    ...(namedElsewhere ? {} : { serviceName: 'petstore' }),
    ...(options.spanProcessors === undefined ? {} : { spanProcessors: options.spanProcessors }),
    metricReaders: [], // traces only: the SDK's default OTLP metrics cost a histogram update per query
    instrumentations: [
      // Statement text only (enhancedDatabaseReporting off: no parameter values), and only inside a request.
      new PgInstrumentation({ requireParentSpan: true, enhancedDatabaseReporting: false }),
      // Command names only: the default would record EVALSHA's arguments, the rate-limit keys (client addresses).
      new IORedisInstrumentation({ requireParentSpan: true, dbStatementSerializer: (command: string) => command }),
      new FastifyOtelInstrumentation({
        registerOnInitialization: true,
        // Request and handler spans, not one per hook: a span per onRequest/onSend/onResponse hook
        // would be most of the spans, and of their cost (bench/README.md), and say little.
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
  return { shutdown: () => sdk.shutdown() }
}

/** Set by the --import entry below when it started the SDK; server.ts flushes it on shutdown. */
export let telemetry: Telemetry | undefined

// Loaded with --import, before the service: start when configured.
if (telemetryWanted()) telemetry = await startTelemetry()
