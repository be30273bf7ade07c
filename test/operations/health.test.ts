import t from 'tap'
import pg from 'pg'
import { buildApp } from '../../src/app.js'
import { loadConfig } from '../../src/config.js'
import { runMigrations } from '../../src/db/migrate.js'
import { AUTH, TEST_KEY, metric, testApp, until } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { lockCategories, withClient } from '../helpers/pg-client.js'

const db = await testDatabase(t)
const { app } = await testApp(t, db.url)

t.test('live and ready answer 200 when the database is reachable and migrated', async t => {
  const live = await app.inject({ method: 'GET', url: '/health/live' })
  t.equal(live.statusCode, 200)
  t.same(live.json(), { status: 'ok' })
  const ready = await app.inject({ method: 'GET', url: '/health/ready' })
  t.equal(ready.statusCode, 200)
  t.same(ready.json(), { status: 'ok' })
})

t.test('ready is 503 when a migration is missing', async t => {
  const client = new pg.Client({ connectionString: db.url })
  await client.connect()
  t.teardown(async () => {
    await client.end()
  })
  const { rows } = await client.query('SELECT name FROM pgmigrations ORDER BY run_on DESC, id DESC LIMIT 1')
  await client.query('DELETE FROM pgmigrations WHERE name = $1', [rows[0].name])
  const ready = await app.inject({ method: 'GET', url: '/health/ready' })
  t.equal(ready.statusCode, 503)
  t.equal(ready.json().code, 'SERVICE_UNAVAILABLE')
  t.match(ready.json().message, /migrations/)
  t.equal((await app.inject({ method: 'GET', url: '/health/live' })).statusCode, 200, 'live stays 200')
  await client.query('INSERT INTO pgmigrations (name, run_on) VALUES ($1, now())', [rows[0].name])
  t.equal((await app.inject({ method: 'GET', url: '/health/ready' })).statusCode, 200)
})

t.test('ready is 503 from the moment shutdown begins; responses then say Connection: close', async t => {
  const readyDb = await db.createDatabase()
  const { app: closing } = await testApp(t, readyDb)
  closing.lifecycle.shuttingDown = true
  const ready = await closing.inject({ method: 'GET', url: '/health/ready' })
  t.equal(ready.statusCode, 503)
  t.match(ready.json().message, /shutting down/)
  t.equal(ready.headers.connection, 'close')
  t.equal(
    (await closing.inject({ method: 'GET', url: '/health/live' })).statusCode,
    200,
    'still serving while it drains'
  )
})

t.test(
  'a warm start: ready only once the list is built, live meanwhile; then the first list is the cached one',
  async t => {
    const url = await db.createDatabase()
    await runMigrations(url, { info () {}, warn () {}, error () {} })
    await withClient(url, async client =>
      await client.query("INSERT INTO categories (name) SELECT 'warm ' || i FROM generate_series(1, 1000) AS i"))
    // The build's read waits behind this lock: the instance is up, and its list is not built.
    const locker = await lockCategories(t, url, 'ACCESS EXCLUSIVE')
    const config = loadConfig({ DATABASE_URL: url, API_KEYS: TEST_KEY, LOG_LEVEL: 'warn', METRICS_PORT: '0' })
    const cold = await buildApp({ ...config, databaseUrl: url })
    t.teardown(async () => {
      await cold.close()
    })
    await cold.ready()
    await until('the feed hears', async () => (await metric(cold, 'change_feed_listening')) === 1)
    const waiting = await cold.inject({ method: 'GET', url: '/health/ready' })
    t.same(waiting.json(), { code: 'SERVICE_UNAVAILABLE', message: 'the lists are being built', status: 503 })
    t.equal(await metric(cold, 'health_not_ready', { reason: 'lists_not_built' }), 1)
    t.equal((await cold.inject({ method: 'GET', url: '/health/live' })).statusCode, 200, 'live while it builds')
    await locker.query('ROLLBACK')
    await until('ready', async () => (await cold.inject({ method: 'GET', url: '/health/ready' })).statusCode === 200)
    const built = await metric(cold, 'categories_list_reads_total', { source: 'refresh' })
    const list = await cold.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
    t.equal(list.json().length, 1000)
    t.equal(
      await metric(cold, 'categories_list_reads_total', { source: 'refresh' }),
      built,
      'no build for the first read'
    )
    t.equal(await metric(cold, 'categories_list_reads_total', { source: 'cache' }), 1, 'it came from the cache')
  }
)
