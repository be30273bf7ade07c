import { setTimeout as sleep } from 'node:timers/promises'
import pg from 'pg'
import t from 'tap'
import { isDatabaseUnavailable } from '../../src/db/errors.js'
import { AUTH, json, testApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

/*
 * Database states in which the service cannot serve: each is a 503 with
 * Retry-After (never a 500), and readiness says so when writes are refused.
 * A standby in recovery is tested for real in test/topology/failover.test.ts.
 */

const db = await testDatabase(t)
const { app } = await testApp(t, db.url)
const admin = new pg.Client({ connectionString: db.url })
await admin.connect()
t.teardown(async () => {
  await admin.end()
})
const databaseName = new URL(db.url).pathname.slice(1)

/** New sessions get the database's settings: end the service's sessions so that its pool opens new ones. */
async function endServiceSessions (): Promise<void> {
  await admin.query(
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE 'petstore%'",
    [databaseName]
  )
}

/** The status /health/ready settles on: sessions the server just ended may fail one probe before the pool notices. */
async function readyWithin (ms: number): Promise<number> {
  const deadline = Date.now() + ms
  for (;;) {
    const { statusCode } = await app.inject({ method: 'GET', url: '/health/ready' })
    if (statusCode === 200 || Date.now() > deadline) return statusCode
    await sleep(50)
  }
}

t.test('a read-only database: writes and readiness are 503 with Retry-After, reads still served', async t => {
  t.equal((await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name: 'before' }) })).statusCode, 201)
  await admin.query(`ALTER DATABASE ${databaseName} SET default_transaction_read_only = on`)
  t.teardown(async () => {
    await admin.query(`ALTER DATABASE ${databaseName} RESET default_transaction_read_only`)
  })
  await endServiceSessions()

  for (const headers of [{}, { 'idempotency-key': 'read-only-1' }]) {
    const res = await app.inject({
      method: 'POST',
      url: '/v1/categories',
      headers: { ...AUTH, 'content-type': 'application/json', ...headers },
      payload: '{"name":"refused"}'
    })
    t.equal(res.statusCode, 503, `POST ${JSON.stringify(headers)}: ${res.body}`)
    t.same(res.json(), { code: 'SERVICE_UNAVAILABLE', message: res.json().message, status: 503 })
    t.match(String(res.headers['retry-after']), /^\d+$/)
  }
  const ready = await app.inject({ method: 'GET', url: '/health/ready' })
  t.equal(ready.statusCode, 503, 'a balancer stops sending traffic')
  t.match(ready.json().message, /read-only|cannot take writes/)
  t.match(String(ready.headers['retry-after']), /^\d+$/)
  const list = await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  t.equal(list.statusCode, 200, 'reads are still consistent on a read-only primary')
  t.same(
    (list.json() as Array<{ name: string }>).map(c => c.name),
    ['before']
  )

  await admin.query(`ALTER DATABASE ${databaseName} RESET default_transaction_read_only`)
  await endServiceSessions()
  t.equal(await readyWithin(5000), 200, 'ready again once writes are accepted')
  const retried = await app.inject({
    method: 'POST',
    url: '/v1/categories',
    headers: { ...AUTH, 'content-type': 'application/json', 'idempotency-key': 'read-only-1' },
    payload: '{"name":"refused"}'
  })
  t.equal(retried.statusCode, 201, 'the refused key is free for its retry')
  t.equal(retried.headers['idempotent-replayed'], undefined)
})

t.test('which database errors mean "cannot serve now" (503) and which are bugs (500)', async t => {
  const unavailable: Array<[string, string]> = [
    ['25006', 'read-only transaction: a standby, or default_transaction_read_only'],
    ['25P03', 'idle-in-transaction timeout ended the session'],
    ['26000', 'prepared statement missing (a pooler switched server connections)'],
    ['42P05', 'prepared statement already exists (a pooler switched server connections)'],
    ['40001', 'serialization failure: retry'],
    ['40P01', 'deadlock detected: retry'],
    ['55P03', 'lock not available'],
    ['57P01', 'admin shutdown'],
    ['57P02', 'crash shutdown'],
    ['57P03', 'cannot connect now (starting, stopping, in recovery)'],
    ['57014', 'statement timeout'],
    ['53300', 'too many connections'],
    ['53100', 'disk full'],
    ['08006', 'connection failure'],
    ['58030', 'I/O error'],
    ['40003', 'statement completion unknown'],
    ['3D000', 'database does not exist (being restored)'],
    ['28P01', 'password rejected (rotated)']
  ]
  for (const [code, why] of unavailable) {
    t.ok(isDatabaseUnavailable(Object.assign(new Error('x'), { code })), `${code}: ${why}`)
  }
  for (const [code, why] of [
    ['23505', 'unique violation'],
    ['42601', 'syntax error'],
    ['22P02', 'invalid text representation'],
    ['42P01', 'undefined table'],
    ['XX000', 'internal error']
  ]) {
    t.notOk(isDatabaseUnavailable(Object.assign(new Error('x'), { code })), `${code} (${why}) is a bug: 500`)
  }
})
