import { once } from 'node:events'
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type pg from 'pg'
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client'
import { ApiError, errorForStatus, notFound } from './errors.js'
import { answerServerEvents, clientErrorHandler, originForm, protocolError } from './protocol.js'

declare module 'fastify' {
  interface FastifyInstance { metrics: Registry }
}

// Labelled by route pattern, never the raw URL. One access line per request, with the key's id: who asked what.
async function metrics (app: FastifyInstance): Promise<void> {
  const registry = new Registry()
  collectDefaultMetrics({ register: registry })
  const durations = new Histogram({
    name: 'http_request_duration_seconds',
    help: 'Duration of HTTP requests by method, route and status',
    labelNames: ['method', 'route', 'status'],
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [registry]
  })
  app.decorate('metrics', registry)
  app.addHook('onResponse', function requestCompleted (request, reply, done) {
    const ms = reply.elapsedTime
    const route = request.routeOptions.url ?? 'unmatched'
    durations.observe({ method: request.method, route, status: reply.statusCode }, ms / 1000)
    request.log.info({ req: request, statusCode: reply.statusCode, ms: Math.round(ms) }, 'request completed')
    done()
  })
}

export default fp(metrics, { name: 'metrics' })

export function registerPoolMetrics (registry: Registry, pool: pg.Pool): void {
  const registers = [registry]
  const poolGauge = (name: string, help: string, read: () => number): Gauge =>
    new Gauge({ name, help, registers, collect () { this.set(read()) } })
  poolGauge('db_pool_connections', 'Connections the pool holds, idle or in use', () => pool.totalCount)
  poolGauge('db_pool_connections_idle', 'Idle connections in the pool', () => pool.idleCount)
  poolGauge('db_pool_requests_waiting', 'Queries waiting for a connection', () => pool.waitingCount)
  const errors = new Counter({ name: 'db_pool_errors_total', help: 'Errors on idle pool connections', registers })
  pool.on('error', () => { errors.inc() })
}

export function registerKeyStoreMetrics (registry: Registry, store: { activeCount: number, reloadFailures: number }):
void {
  const registers = [registry]
  /* eslint-disable no-new */
  new Gauge({
    name: 'api_keys_active',
    help: 'Managed API keys that authenticate now, as last read from the database',
    registers,
    collect () {
      this.set(store.activeCount)
    }
  })
  new Counter({
    name: 'api_keys_reload_failures_total',
    help: 'Reads of the managed API keys that failed; the keys read before keep working',
    registers,
    collect () {
      this.reset()
      this.inc(store.reloadFailures)
    }
  })
  /* eslint-enable no-new */
}

function metricsRouteError (req: IncomingMessage): ApiError | undefined {
  if (req.url !== '/metrics') return notFound('metrics are at GET /metrics')
  if (req.method === 'GET' || req.method === 'HEAD') return undefined
  const message = `${req.method ?? ''} is not allowed on /metrics; use GET, HEAD`
  return new ApiError(405, 'METHOD_NOT_ALLOWED', message, { allow: 'GET, HEAD' })
}

function sendError (res: ServerResponse, error: ApiError): void {
  const body = JSON.stringify(error.toBody())
  const headers = { ...error.headers, 'content-type': 'application/json; charset=utf-8' }
  res.writeHead(error.status, { ...headers, 'content-length': Buffer.byteLength(body) }).end(body)
}

/** GET /metrics on its own listener (never the public port), every other answer in the Error shape. */
export async function startMetricsServer (registry: Registry, options: { port: number, host: string }):
Promise<Server | undefined> {
  if (options.port === 0) return undefined
  const serve = (req: IncomingMessage, res: ServerResponse): void => {
    req.url = originForm(req)
    const error = protocolError(req) ?? metricsRouteError(req)
    if (error !== undefined) return sendError(res, error)
    registry.metrics().then(text => {
      res.writeHead(200, { 'content-type': registry.contentType, 'content-length': Buffer.byteLength(text) }).end(text)
    }, () => { sendError(res, errorForStatus(500, 'internal error')) })
  }
  const server = createServer({ requireHostHeader: false }, serve)
  server.on('clientError', clientErrorHandler)
  answerServerEvents(server, serve)
  await once(server.listen(options.port, options.host), 'listening')
  return server
}
