import { createServer, type Server } from 'node:http'
import type pg from 'pg'
import { Counter, Gauge, Registry, collectDefaultMetrics, type Metric } from 'prom-client'

const DURATION_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5]

/** One line of the exposition, as prom-client's Registry formats it. */
interface ExportedValue { labels: Record<string, string | number>, value: number, metricName: string }

interface DurationSeries {
  labels: { method: string, route: string, status: number }
  /** Observations per bucket (not cumulative); the last one is above every bound (+Inf). */
  counts: number[]
  sum: number
  count: number
}

/**
 * http_request_duration_seconds, exposed exactly as prom-client's Histogram
 * exposes it, but observed for a fraction of its cost: prom-client's observe()
 * validates and hashes the labels object on every call (a few percent of a
 * cached GET's CPU in bench/profile.ts); here a request finds its series
 * through three Map lookups on values it already has and bumps one counter.
 * The series are bounded: route patterns (never raw URLs), the methods Node's
 * parser accepts, HTTP statuses.
 */
export class RequestDurations {
  readonly name = 'http_request_duration_seconds'
  readonly help = 'Duration of HTTP requests by method, route and status'
  readonly type = 'histogram'
  readonly aggregator = 'sum'
  /** Route pattern, then method, then status: the same string objects every request, so no key is built. */
  private series = new Map<string, Map<string, Map<number, DurationSeries>>>()

  observe (method: string, route: string, status: number, seconds: number): void {
    let byMethod = this.series.get(route)
    if (byMethod === undefined) this.series.set(route, byMethod = new Map())
    let byStatus = byMethod.get(method)
    if (byStatus === undefined) byMethod.set(method, byStatus = new Map())
    let series = byStatus.get(status)
    if (series === undefined) {
      series = { labels: { method, route, status }, counts: new Array<number>(DURATION_BUCKETS.length + 1).fill(0), sum: 0, count: 0 }
      byStatus.set(status, series)
    }
    let bucket = 0
    while (bucket < DURATION_BUCKETS.length && seconds > (DURATION_BUCKETS[bucket] as number)) bucket++
    series.counts[bucket] = (series.counts[bucket] as number) + 1
    series.sum += seconds
    series.count++
  }

  /** What prom-client's Registry reads: cumulative buckets, then +Inf, sum and count, per series. */
  async get (): Promise<{ name: string, help: string, type: string, values: ExportedValue[], aggregator: string }> {
    const values: ExportedValue[] = []
    const all = [...this.series.values()].flatMap(byMethod => [...byMethod.values()].flatMap(byStatus => [...byStatus.values()]))
    for (const { labels, counts, sum, count } of all) {
      let cumulative = 0
      DURATION_BUCKETS.forEach((le, i) => {
        cumulative += counts[i] as number
        values.push({ labels: { le, ...labels }, value: cumulative, metricName: `${this.name}_bucket` })
      })
      values.push({ labels: { le: '+Inf', ...labels }, value: count, metricName: `${this.name}_bucket` },
        { labels, value: sum, metricName: `${this.name}_sum` },
        { labels, value: count, metricName: `${this.name}_count` })
    }
    return { name: this.name, help: this.help, type: this.type, values, aggregator: this.aggregator }
  }

  reset (): void { this.series = new Map() }
}

/**
 * Prometheus metrics: request duration by route and status, and the database
 * pool's counts. They are served on their own port (METRICS_PORT), never on the
 * public one. app.ts observes each request in its one onResponse hook.
 */
export function registerMetrics (pool: pg.Pool): { registry: Registry, durations: RequestDurations } {
  const registry = new Registry()
  collectDefaultMetrics({ register: registry })
  const durations = new RequestDurations()
  // The Registry reads any metric through get() and reset(); its types only name its own classes.
  registry.registerMetric(durations as unknown as Metric)
  const poolGauge = (name: string, help: string, read: () => number): Gauge => new Gauge({
    name, help, registers: [registry], collect () { this.set(read()) }
  })
  poolGauge('db_pool_connections_total', 'Connections the pool holds', () => pool.totalCount)
  poolGauge('db_pool_connections_idle', 'Idle connections in the pool', () => pool.idleCount)
  poolGauge('db_pool_requests_waiting', 'Queries waiting for a connection', () => pool.waitingCount)
  const poolErrors = new Counter({ name: 'db_pool_errors_total', help: 'Errors on idle pool connections', registers: [registry] })
  pool.on('error', () => { poolErrors.inc() })
  return { registry, durations }
}

export async function startMetricsServer (registry: Registry, options: { port: number, host: string }): Promise<Server | undefined> {
  if (options.port === 0) return undefined
  const server = createServer((req, res) => {
    if (req.method !== 'GET' || req.url !== '/metrics') {
      res.writeHead(404, { 'content-type': 'application/json; charset=utf-8' })
      res.end(JSON.stringify({ code: 'NOT_FOUND', message: 'metrics are at GET /metrics', status: 404 }))
      return
    }
    registry.metrics().then(text => {
      res.writeHead(200, { 'content-type': registry.contentType })
      res.end(text)
    }, () => {
      res.writeHead(500, { 'content-type': 'application/json; charset=utf-8' })
      res.end(JSON.stringify({ code: 'INTERNAL_ERROR', message: 'internal error', status: 500 }))
    })
  })
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(options.port, options.host, resolve)
  })
  return server
}
