import { randomBytes } from 'node:crypto'
import Fastify, { LogController, type FastifyInstance, type FastifyServerOptions } from 'fastify'
import type { Registry } from 'prom-client'
import categories from './categories/index.js'
import type { Config } from './config.js'
import { createPool } from './db/pool.js'
import { DatabaseServers } from './db/servers.js'
import { migrationNames } from './db/migrate.js'
import auth from './http/auth.js'
import { registerCachedListAnswers } from './http/cached-lists.js'
import { clientErrorHandler, frameworkErrors, registerErrorHandling } from './http/error-handler.js'
import { ErrorSchema } from './http/errors.js'
import { registerHealthRoutes } from './http/health.js'
import { registerJsonBodyParser } from './http/json-body.js'
import { registerMetrics } from './http/metrics.js'
import { registerResponseHeaders, requestId, type Lifecycle } from './http/lifecycle.js'
import { lazyRequestLogger } from './http/request-logger.js'
import { registerOpenApi } from './http/openapi.js'
import data from './plugins/data.js'
import rateLimits from './http/rate-limit.js'
import { registerSingletonHeaderCheck } from './http/singleton-headers.js'
import { registerPetRoutes } from './pets/routes.js'
import { registerStoreRoutes } from './store/routes.js'

export interface AppOptions {
  /** Where log lines go (tests capture them); stdout by default. */
  logStream?: NodeJS.WritableStream
}

declare module 'fastify' {
  interface FastifyInstance {
    lifecycle: Lifecycle
    metrics: Registry
  }
}

/** Requests slower than this are logged at info even when they succeed. */
const SLOW_REQUEST_MS = 1000

/** Expired Idempotency-Key records are deleted this often, in small batches, off the request path. */
const IDEMPOTENCY_CLEANUP_INTERVAL_MS = 10 * 60 * 1000

function loggerOptions (config: Config, options: AppOptions): FastifyServerOptions['logger'] {
  return {
    level: config.logLevel,
    ...(options.logStream === undefined ? {} : { stream: options.logStream }),
    // Never log credentials, and never the query string (a client might put a key there).
    redact: { paths: ['req.headers.authorization', 'headers.authorization', 'authorization'], censor: '[redacted]' },
    serializers: {
      req: (req: { method: string, url: string, ip?: string }) => ({ method: req.method, url: req.url.split('?')[0], remoteAddress: req.ip })
    }
  }
}

/**
 * The whole service: production (server.ts) and every test build it through this one factory.
 * It needs no database to be built (nothing connects until a request or the change feed does):
 * the migrations are applied before it (db/migrate.ts), and the OpenAPI export builds it alone.
 */
export async function buildApp (config: Config & { databaseUrl: string }, options: AppOptions = {}): Promise<FastifyInstance> {
  const app = Fastify({
    logger: loggerOptions(config, options),
    // One log line per request (the onResponse hook below) instead of Fastify's two.
    logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: 'requestId' }),
    // request.log's pino child is made only when a line is written (most requests write none at info).
    childLoggerFactory: lazyRequestLogger,
    genReqId: requestId,
    trustProxy: config.trustProxy,
    bodyLimit: config.bodyLimitBytes,
    requestTimeout: config.requestTimeoutMs,
    keepAliveTimeout: config.keepAliveTimeoutMs,
    http: {
      // Slow clients (slowloris) get 408 once the headers take longer than this; Node checks every second, not every 30 s.
      headersTimeout: config.headersTimeoutMs,
      requestTimeout: config.requestTimeoutMs,
      connectionsCheckingInterval: Math.min(1000, config.headersTimeoutMs),
      maxHeaderSize: config.maxHeaderBytes
    },
    // Requests that arrive while closing are still served (with Connection: close), and get our Error body if they fail.
    return503OnClosing: false,
    clientErrorHandler,
    frameworkErrors,
    ajv: {
      // The contract forbids coercing types and silently dropping unknown members.
      customOptions: { coerceTypes: false, removeAdditional: false, useDefaults: false, allErrors: false, formats: { int64: true } }
    }
  })

  const lifecycle: Lifecycle = { shuttingDown: false }
  app.decorate('lifecycle', lifecycle)

  registerResponseHeaders(app, lifecycle)
  registerErrorHandling(app)
  registerJsonBodyParser(app)
  // Before the rate limits and auth: a repeated Authorization is refused before any key is looked at.
  registerSingletonHeaderCheck(app)

  // Unique per instance: the change notifications name the writer, so the list cache can skip the echo of its own creates.
  const writerName = `petstore/${randomBytes(6).toString('hex')}`
  // Every connection, the pool's and the change feed's, is checked against the server the database address leads to now.
  const servers = new DatabaseServers((fields, message) => { app.log.warn(fields, message) })
  const pool = createPool({ connectionString: config.databaseUrl, applicationName: writerName, max: config.db.poolMax, connectionTimeoutMs: config.db.connectionTimeoutMs, statementTimeoutMs: config.db.statementTimeoutMs, preparedStatements: config.db.preparedStatements, maxWaiting: config.db.maxWaiting, servers },
    (err) => { app.log.warn({ err }, 'idle database connection failed') })
  app.addHook('onClose', async () => { await pool.end() })
  const { registry, durations } = registerMetrics(pool)
  app.decorate('metrics', registry)
  // Before any route: it finds the list routes as they are added.
  registerCachedListAnswers(app, { lifecycle, durations, registry })
  // One hook for everything that follows a response (each hook is a step of Fastify's runner on every request).
  app.addHook('onResponse', function requestCompleted (request, reply, done) {
    const ms = reply.elapsedTime
    // The route pattern, not the raw URL, so ids do not explode the label set.
    durations.observe(request.method, request.routeOptions.url ?? 'unmatched', reply.statusCode, ms / 1000)
    // Failures and slow requests at info; the rest at debug: a log line per request is a measurable
    // share of a cached GET (docs/performance.md), and the balancer and the metrics see every request.
    const level = reply.statusCode >= 400 || ms >= SLOW_REQUEST_MS ? 'info' : 'debug'
    request.log[level]({ req: request, statusCode: reply.statusCode, ms: Math.round(ms) }, 'request completed')
    done()
  })

  app.addSchema(ErrorSchema)
  await registerOpenApi(app)
  // The failed-authentication and per-key limits: auth.ts's one access hook applies them around the key check (this plugin adds no hook).
  await app.register(rateLimits, { digests: config.apiKeyDigests, ...config.rateLimit, redis: config.redis, registry: app.metrics })
  await app.register(auth, { digests: config.apiKeyDigests })

  registerHealthRoutes(app, { pool, migrations: await migrationNames(), lifecycle })
  // What every resource shares: the pool, one change feed, the Idempotency-Key store.
  await app.register(data, {
    pool,
    listen: config.databaseDirectUrl === undefined
      ? { connectionString: config.databaseUrl, connectionName: 'DATABASE_URL' }
      : { connectionString: config.databaseDirectUrl, connectionName: 'DATABASE_DIRECT_URL' },
    writerName,
    // As long as the pool itself lets the probe wait for a connection and run (query_timeout).
    probeSendTimeoutMs: config.db.connectionTimeoutMs + config.db.statementTimeoutMs + 1000,
    onConnect: servers.register,
    idempotencyCleanupMs: IDEMPOTENCY_CLEANUP_INTERVAL_MS,
    registry: app.metrics
  })
  // The resources.
  await app.register(categories)
  registerPetRoutes(app, { sunset: config.petsSunset })
  registerStoreRoutes(app)

  return app
}
