import { randomBytes } from 'node:crypto'
import { trace } from '@opentelemetry/api'
import Fastify, { LogController, type FastifyInstance } from 'fastify'
import categories from './categories/routes.js'
import type { Config } from './config.js'
import auth from './http/auth.js'
import cors from './http/cors.js'
import errors, { frameworkErrors } from './http/error-handler.js'
import health from './http/health.js'
import jsonBody from './http/json-body.js'
import lifecycle, { requestId } from './http/lifecycle.js'
import methodNotAllowed from './http/method-not-allowed.js'
import metrics from './http/metrics.js'
import openapi from './http/openapi.js'
import protocol, { clientErrorHandler, originForm } from './http/protocol.js'
import rateLimits from './http/rate-limit.js'
import pets from './pets/routes.js'
import data from './http/data.js'
import store from './store/routes.js'
import { wellFormedPattern } from './shared/text-rules.js'

/** Node checks slow headers and bodies this often (its default is every 30 s). */
const CONNECTIONS_CHECK_MS = 1000
const IDEMPOTENCY_CLEANUP_MS = 10 * 60 * 1000

function traceFields (): Record<string, string> {
  const span = trace.getActiveSpan()
  if (span === undefined) return {}
  const { traceId, spanId } = span.spanContext()
  return { trace_id: traceId, span_id: spanId }
}

/** The whole service, as server.ts and every test build it. Nothing connects until a request or the feed does. */
export async function buildApp (
  config: Config & { databaseUrl: string }, options: { logStream?: NodeJS.WritableStream } = {}
): Promise<FastifyInstance> {
  const app = Fastify({
    logger: {
      level: config.logLevel,
      stream: options.logStream,
      // Never credentials, and never the query string (a client might put a key there).
      redact: { paths: ['req.headers.authorization', 'headers.authorization', 'authorization'], censor: '[redacted]' },
      mixin: traceFields,
      serializers: {
        req: (req: { method: string, url: string, ip?: string, apiKey?: { id: string } | null }) =>
          ({ method: req.method, url: req.url.split('?')[0], remoteAddress: req.ip, apiKeyId: req.apiKey?.id })
      }
    },
    // One log line per request (metrics.ts's onResponse hook) instead of Fastify's two.
    logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: 'requestId' }),
    genReqId: requestId,
    trustProxy: config.trustProxy,
    rewriteUrl: originForm,
    bodyLimit: config.bodyLimitBytes,
    requestTimeout: config.requestTimeoutMs,
    keepAliveTimeout: config.keepAliveTimeoutMs,
    http: {
      // Slowloris gets 408; Node checks every second, not every 30 s.
      headersTimeout: config.headersTimeoutMs,
      requestTimeout: config.requestTimeoutMs,
      connectionsCheckingInterval: Math.min(CONNECTIONS_CHECK_MS, config.headersTimeoutMs),
      maxHeaderSize: config.maxHeaderBytes,
      // protocol.ts answers a missing Host in our shape; Node's own answer is a bare 400.
      requireHostHeader: false
    },
    // Requests that arrive while closing are still served (with Connection: close).
    return503OnClosing: false,
    clientErrorHandler,
    frameworkErrors,
    ajv: {
      // The contract forbids coercing types and silently dropping unknown members.
      customOptions: {
        coerceTypes: false,
        removeAdditional: false,
        useDefaults: false,
        formats: { int64: true },
        // Every pattern also refuses lone surrogates, which a portable pattern cannot say.
        code: { regExp: wellFormedPattern }
      }
    }
  })

  // Plugins run their hooks in this order, and each names the ones it needs before it (fastify-plugin checks).
  await app.register(lifecycle)
  await app.register(errors)
  await app.register(metrics)
  await app.register(jsonBody)
  await app.register(cors, { origins: config.corsOrigins })
  await app.register(protocol)
  await app.register(openapi)
  await app.register(rateLimits, { ...config.rateLimit, redis: config.redis })
  await app.register(data, {
    database: {
      ...config.db,
      max: config.db.poolMax,
      connectionString: config.databaseUrl,
      // Unique per instance: each instance's sessions can be told apart in pg_stat_activity.
      applicationName: `petstore/${randomBytes(6).toString('hex')}`,
      log: (fields, message) => { app.log.warn(fields, message) }
    },
    listen: config.databaseDirectUrl === undefined
      ? { connectionString: config.databaseUrl, connectionName: 'DATABASE_URL' }
      : { connectionString: config.databaseDirectUrl, connectionName: 'DATABASE_DIRECT_URL' },
    idempotencyCleanupMs: IDEMPOTENCY_CLEANUP_MS
  })
  await app.register(auth, { digests: config.apiKeyDigests })
  await app.register(methodNotAllowed)
  await app.register(health)
  await app.register(categories)
  await app.register(pets, { sunset: config.petsSunset })
  await app.register(store)
  return app
}
