import t from 'tap'
import pg from 'pg'
import { testApp } from './helpers/app.js'
import { testDatabase } from './helpers/database.js'

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
  t.teardown(async () => { await client.end() })
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
  t.equal((await closing.inject({ method: 'GET', url: '/health/live' })).statusCode, 200, 'still serving while it drains')
})

t.test('two instances migrating the same fresh database at once both start (advisory lock waits)', async t => {
  const shared = await db.createDatabase()
  const [a, b] = await Promise.all([testApp(t, shared), testApp(t, shared)])
  t.equal((await a.app.inject({ method: 'GET', url: '/health/ready' })).statusCode, 200)
  t.equal((await b.app.inject({ method: 'GET', url: '/health/ready' })).statusCode, 200)
})
