import t from 'tap'
import { freePort } from '../helpers/ports.js'
import { startMetricsServer } from '../../src/http/metrics.js'
import { testApp, AUTH } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

const db = await testDatabase(t)
const { app } = await testApp(t, db.url)
const port = await freePort()
const server = await startMetricsServer(app.metrics, { port, host: '127.0.0.1' })
t.teardown(() => {
  server?.close()
})

t.test('Prometheus metrics on their own port: request duration by route and status, pool counts', async t => {
  await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  await app.inject({ method: 'GET', url: '/v1/categories/42', headers: AUTH })
  await app.inject({ method: 'GET', url: '/v1/nope', headers: AUTH })
  const res = await fetch(`http://127.0.0.1:${port}/metrics`)
  t.equal(res.status, 200)
  t.match(res.headers.get('content-type'), /^text\/plain/)
  const text = await res.text()
  t.match(text, /http_request_duration_seconds_count\{method="GET",route="\/v1\/categories",status="200"\} 1/)
  t.match(
    text,
    /http_request_duration_seconds_count\{method="GET",route="\/v1\/categories\/:id",status="404"\} 1/,
    'the route pattern, not the raw URL'
  )
  t.match(text, /http_request_duration_seconds_count\{method="GET",route="unmatched",status="404"\} 1/)
  for (const gauge of ['db_pool_connections', 'db_pool_connections_idle', 'db_pool_requests_waiting']) {
    t.match(text, new RegExp(`^${gauge} \\d+$`, 'm'), gauge)
  }
  const publicPort = await app.inject({ method: 'GET', url: '/metrics' })
  t.equal(publicPort.statusCode, 404, 'not on the public port')
})

t.test('METRICS_PORT=0 turns the listener off', async t => {
  t.equal(await startMetricsServer(app.metrics, { port: 0, host: '127.0.0.1' }), undefined)
})
