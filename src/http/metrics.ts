import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type pg from 'pg'
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client'
import { ApiError, notFound } from './errors.js'
import { answerServerEvents, clientErrorHandler, originForm, protocolError } from './protocol.js'

/**
 * Prometheus metrics, served on their own port (METRICS_PORT), never on the
 * public one: request duration by route pattern (never the raw URL, so ids do
 * not explode the label set) and status, the process's defaults, and the
 * database pool's counts.
 */
export function createMetrics (): { registry: Registry, durations: Histogram<'method' | 'route' | 'status'> } {
  const registry = new Registry()
  collectDefaultMetrics({ register: registry })
  const durations = new Histogram({
    name: 'http_request_duration_seconds',
    help: 'Duration of HTTP requests by method, route and status',
    labelNames: ['method', 'route', 'status'],
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [registry]
  })
  return { registry, durations }
}

export function registerPoolMetrics (registry: Registry, pool: pg.Pool): void {
  const poolGauge = (name: string, help: string, read: () => number): Gauge => new Gauge({
    name, help, registers: [registry], collect () { this.set(read()) }
  })
  poolGauge('db_pool_connections_total', 'Connections the pool holds', () => pool.totalCount)
  poolGauge('db_pool_connections_idle', 'Idle connections in the pool', () => pool.idleCount)
  poolGauge('db_pool_requests_waiting', 'Queries waiting for a connection', () => pool.waitingCount)
  const poolErrors = new Counter({ name: 'db_pool_errors_total', help: 'Errors on idle pool connections', registers: [registry] })
  pool.on('error', () => { poolErrors.inc() })
}

function metricsRouteError (req: IncomingMessage): ApiError | undefined {
  if (req.url !== '/metrics') return notFound('metrics are at GET /metrics')
  if (req.method === 'GET' || req.method === 'HEAD') return undefined
  const message = `${req.method ?? ''} is not allowed on /metrics; use GET, HEAD`
  return new ApiError(405, 'METHOD_NOT_ALLOWED', message, { allow: 'GET, HEAD' })
}

export async function startMetricsServer (registry: Registry, options: { port: number, host: string }): Promise<Server | undefined> {
  if (options.port === 0) return undefined
  const serve = (req: IncomingMessage, res: ServerResponse): void => {
    req.url = originForm(req)
    const error = protocolError(req) ?? metricsRouteError(req)
    if (error !== undefined) {
      const body = JSON.stringify(error.toBody())
      const type = 'application/json; charset=utf-8'
      res.writeHead(error.status, { ...error.headers, 'content-type': type, 'content-length': Buffer.byteLength(body) })
      res.end(body)
      return
    }
    registry.metrics().then(text => {
      res.writeHead(200, { 'content-type': registry.contentType })
      res.end(text)
    }, () => {
      res.writeHead(500, { 'content-type': 'application/json; charset=utf-8' })
      res.end(JSON.stringify({ code: 'INTERNAL_ERROR', message: 'internal error', status: 500 }))
    })
  }
  // Like the app's server (protocol.ts): every answer of this listener is in the Error shape too.
  const server = createServer({ requireHostHeader: false }, serve)
  server.on('clientError', clientErrorHandler)
  answerServerEvents(server, serve)
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(options.port, options.host, resolve)
  })
  return server
}
