import type { IncomingMessage } from 'node:http'
import type { SpanProcessor } from '@opentelemetry/sdk-trace'

/**
 * OpenTelemetry tracing, configured only by the standard OTEL_* variables. Loaded
 * before the service (`node --import ./dist/telemetry.js dist/server.js`, as npm start
 * and the image run it) so that http, pg and ioredis are instrumented before any of
 * them is imported; Fastify is instrumented by @fastify/otel through its
 * initialization diagnostics channel, on every instance. Off (nothing loaded beyond
 * this file) unless an exporter is configured: OTEL_EXPORTER_OTLP_ENDPOINT,
 * OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_TRACES_EXPORTER; OTEL_SDK_DISABLED=true
 * turns it off whatever else is set.
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
 * Starts the SDK: the exporter, sampler, propagators and resource from OTEL_*
 * (service.name defaults to petstore); `spanProcessors` replaces the exporter (tests).
 */
export async function startTelemetry (options: { spanProcessors?: SpanProcessor[] } = {}): Promise<Telemetry> {
  // ESM: `import` of a CommonJS package (ioredis) bypasses require hooks; import-in-the-middle's loader lets the
  // instrumentations wrap it, and (through the message channel) only the modules they hook.
  const [{ register }, { createAddHookMessageChannel }] = await Promise.all([import('node:module'), import('import-in-the-middle')])
  const { registerOptions, waitForAllMessagesAcknowledged } = createAddHookMessageChannel()
  register('import-in-the-middle/hook.mjs', import.meta.url, registerOptions)
  const [{ NodeSDK }, { HttpInstrumentation }, { PgInstrumentation }, { IORedisInstrumentation }, { FastifyOtelInstrumentation }] = await Promise.all([
    import('@opentelemetry/sdk-node'),
    import('@opentelemetry/instrumentation-http'),
    import('@opentelemetry/instrumentation-pg'),
    import('@opentelemetry/instrumentation-ioredis'),
    import('@fastify/otel')
  ])
  const env = process.env
  const namedElsewhere = (env.OTEL_SERVICE_NAME ?? '') !== '' || /(^|,)\s*service\.name\s*=/.test(env.OTEL_RESOURCE_ATTRIBUTES ?? '')
  const sdk = new NodeSDK({
    ...(namedElsewhere ? {} : { serviceName: 'petstore' }),
    ...(options.spanProcessors === undefined ? {} : { spanProcessors: options.spanProcessors }),
    instrumentations: [
      new HttpInstrumentation({
        ignoreIncomingRequestHook: (request: IncomingMessage) => isProbe(request.url),
        // Outgoing requests: only the exporter's own, which must not trace themselves.
        disableOutgoingRequestInstrumentation: true,
        // The API takes no query string; one sent anyway might hold a key, as the log lines assume.
        requestHook: (span, request) => {
          if ('url' in request && request.url?.includes('?') === true) span.setAttribute('url.query', '[redacted]')
        }
      }),
      // Statement text only (enhancedDatabaseReporting off: no parameter values), and only inside a request.
      new PgInstrumentation({ requireParentSpan: true, enhancedDatabaseReporting: false }),
      // Command names only: the default would record EVALSHA's arguments, the rate-limit keys (client addresses).
      new IORedisInstrumentation({ requireParentSpan: true, dbStatementSerializer: (command: string) => command }),
      new FastifyOtelInstrumentation({
        registerOnInitialization: true,
        // Request and handler spans, not one per hook: a span per onRequest/onSend/onResponse hook
        // would be most of the spans, and of their cost (bench/README.md), and say little.
        instrumentHooks: false,
        ignorePaths: (route: { url: string }) => isProbe(route.url),
        requestHook: (span, request) => { if (request.url.includes('?')) span.setAttribute('url.path', request.url.split('?')[0] ?? '') }
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
