import { randomBytes, randomUUID } from 'node:crypto'
import type { IncomingMessage } from 'node:http'
import Fastify, { LogController, type FastifyInstance, type FastifyServerOptions } from 'fastify'
import type { Registry } from 'prom-client'
import { CategoryCreateBatcher } from './categories/create-batcher.js'
import { CategoryListCache } from './categories/list-cache.js'
import { IdempotencyStore } from './categories/idempotency.js'
import { CategoryRepository } from './categories/repository.js'
import { registerCategoryRoutes } from './categories/routes.js'
import { CategorySchema, NewCategorySchema } from './categories/schemas.js'
import type { Config } from './config.js'
import { createPool } from './db/pool.js'
import { migrationNames, runMigrations } from './db/migrate.js'
import auth from './http/auth.js'
import { clientErrorHandler, frameworkErrors, registerErrorHandling } from './http/error-handler.js'
import { ErrorSchema } from './http/errors.js'
import { registerHealthRoutes } from './http/health.js'
import { registerJsonBodyParser } from './http/json-body.js'
import { registerMetrics } from './http/metrics.js'
import { registerConnectionClose, type Lifecycle } from './http/lifecycle.js'
import { registerOpenApi } from './http/openapi.js'
import rateLimits from './http/rate-limit.js'
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

/** A request id from the balancer is kept when it is sane; otherwise we make one. */
const REQUEST_ID = /^[\x21-\x7e]{1,128}$/
function requestId (req: IncomingMessage): string {
  const header = req.headers['x-request-id']
  return typeof header === 'string' && REQUEST_ID.test(header) ? header : randomUUID()
}

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

/** The whole service: production (server.ts) and every test build it through this one factory. */
export async function buildApp (config: Config & { databaseUrl: string }, options: AppOptions = {}): Promise<FastifyInstance> {
  const app = Fastify({
    logger: loggerOptions(config, options),
    // One log line per request (the onResponse hook below) instead of Fastify's two.
    logController: new LogController({ disableRequestLogging: true, requestIdLogLabel: 'requestId' }),
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

  app.addHook('onRequest', (request, reply, done) => {
    reply.header('x-request-id', request.id)
    done()
  })
  app.addHook('onResponse', (request, reply, done) => {
    // Failures and slow requests at info; the rest at debug: a log line per request is a measurable
    // share of a cached GET (docs/performance.md), and the balancer and the metrics see every request.
    const ms = reply.elapsedTime
    const level = reply.statusCode >= 400 || ms >= SLOW_REQUEST_MS ? 'info' : 'debug'
    request.log[level]({ req: request, statusCode: reply.statusCode, ms: Math.round(ms) }, 'request completed')
    done()
  })
  registerConnectionClose(app, lifecycle)
  registerErrorHandling(app)
  registerJsonBodyParser(app)

  await runMigrations(config.databaseUrl, {
    info: (msg) => { app.log.debug(msg) },
    warn: (msg) => { app.log.warn(msg) },
    error: (msg) => { app.log.error(msg) }
  })
  // Unique per instance: the change notifications name the writer, so the list cache can skip the echo of its own creates.
  const writerName = `petstore/${randomBytes(6).toString('hex')}`
  const pool = createPool({ connectionString: config.databaseUrl, applicationName: writerName, max: config.db.poolMax, connectionTimeoutMs: config.db.connectionTimeoutMs, statementTimeoutMs: config.db.statementTimeoutMs, maxWaiting: config.db.maxWaiting },
    (err) => { app.log.warn({ err }, 'idle database connection failed') })
  app.addHook('onClose', async () => { await pool.end() })
  app.decorate('metrics', registerMetrics(app, pool))

  for (const schema of [ErrorSchema, NewCategorySchema, CategorySchema]) app.addSchema(schema)
  await registerOpenApi(app)
  // Before auth: an address over its failed-authentication limit is refused before its key is checked.
  await app.register(rateLimits, { digests: config.apiKeyDigests, ...config.rateLimit })
  await app.register(auth, { digests: config.apiKeyDigests })

  registerHealthRoutes(app, { pool, migrations: await migrationNames(), lifecycle })
  const categories = new CategoryRepository(pool)
  const listCache = new CategoryListCache(categories, { connectionString: config.databaseUrl, ownWriterName: writerName, log: app.log, registry: app.metrics })
  listCache.start()
  app.addHook('onClose', async () => { await listCache.close() })
  const idempotency = new IdempotencyStore(pool)
  idempotency.startCleanup(IDEMPOTENCY_CLEANUP_INTERVAL_MS, (err) => { app.log.warn({ err }, 'deleting expired idempotency keys failed') })
  app.addHook('onClose', async () => { idempotency.stopCleanup() })
  registerCategoryRoutes(app, { categories, creates: new CategoryCreateBatcher(categories, { registry: app.metrics, observer: listCache }), listCache, idempotency })
  registerPetRoutes(app, { sunset: config.petsSunset })
  registerStoreRoutes(app)

  return app
}
