import t from 'tap'
import { freePort } from './helpers/ports.js'
import { Histogram, Registry, type Metric } from 'prom-client'
import { RequestDurations, startMetricsServer } from '../src/http/metrics.js'
import { testApp, AUTH } from './helpers/app.js'
import { testDatabase } from './helpers/database.js'

const db = await testDatabase(t)
const { app } = await testApp(t, db.url)
const port = await freePort()
const server = await startMetricsServer(app.metrics, { port, host: '127.0.0.1' })
t.teardown(() => { server?.close() })

t.test('Prometheus metrics on their own port: request duration by route and status, pool counts', async t => {
  await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  await app.inject({ method: 'GET', url: '/v1/categories/42', headers: AUTH })
  await app.inject({ method: 'GET', url: '/v1/nope', headers: AUTH })
  const res = await fetch(`http://127.0.0.1:${port}/metrics`)
  t.equal(res.status, 200)
  t.match(res.headers.get('content-type'), /^text\/plain/)
  const text = await res.text()
  t.match(text, /http_request_duration_seconds_count\{method="GET",route="\/v1\/categories",status="200"\} 1/)
  t.match(text, /http_request_duration_seconds_count\{method="GET",route="\/v1\/categories\/:id",status="404"\} 1/, 'the route pattern, not the raw URL')
  t.match(text, /http_request_duration_seconds_count\{method="GET",route="unmatched",status="404"\} 1/)
  for (const gauge of ['db_pool_connections_total', 'db_pool_connections_idle', 'db_pool_requests_waiting']) {
    t.match(text, new RegExp(`^${gauge} \\d+$`, 'm'), gauge)
  }
  const other = await fetch(`http://127.0.0.1:${port}/other`)
  t.equal(other.status, 404)
  t.same(await other.json(), { code: 'NOT_FOUND', message: 'metrics are at GET /metrics', status: 404 })
  const publicPort = await app.inject({ method: 'GET', url: '/metrics' })
  t.equal(publicPort.statusCode, 404, 'not on the public port')
})

t.test('METRICS_PORT=0 turns the listener off', async t => {
  t.equal(await startMetricsServer(app.metrics, { port: 0, host: '127.0.0.1' }), undefined)
})

t.test('the request histogram is exposed exactly as prom-client\'s own Histogram would expose it', async t => {
  const ours = new Registry()
  const durations = new RequestDurations()
  ours.registerMetric(durations as unknown as Metric)
  const theirs = new Registry()
  const reference = new Histogram({
    name: 'http_request_duration_seconds',
    help: 'Duration of HTTP requests by method, route and status',
    labelNames: ['method', 'route', 'status'],
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [theirs]
  })
  // On a bound, between bounds, above the last one, zero; three series.
  const observations: Array<[string, string, number, number]> = [
    ['GET', '/v1/categories', 200, 0.001], ['GET', '/v1/categories', 200, 0.0004], ['GET', '/v1/categories', 200, 7.5],
    ['GET', '/v1/categories', 304, 0], ['POST', '/v1/categories', 201, 0.03], ['GET', 'unmatched', 404, 0.26], ['GET', '/v1/categories', 200, 0.0026]
  ]
  for (const [method, route, status, seconds] of observations) {
    durations.observe(method, route, status, seconds)
    reference.observe({ method, route, status }, seconds)
  }
  const text = await ours.metrics()
  t.equal(text, await theirs.metrics())
  t.match(text, /http_request_duration_seconds_bucket\{le="0.001",method="GET",route="\/v1\/categories",status="200"\} 2/)
  durations.reset()
  t.equal(await ours.metrics(), '# HELP http_request_duration_seconds Duration of HTTP requests by method, route and status\n# TYPE http_request_duration_seconds histogram\n')
})
