import pg from 'pg'
import t from 'tap'
import { migrationNames, runMigrations } from '../src/db/migrate.js'
import { testApp } from './helpers/app.js'
import { testDatabase } from './helpers/database.js'
import { withClient } from './helpers/pg-client.js'

/*
 * Migrations at start (src/db/migrate.ts): one transaction under a transaction-scoped
 * advisory lock. Through PgBouncer: test/topology/pgbouncer.test.ts.
 */

const db = await testDatabase(t)
const quiet = { info () {}, warn () {}, error () {} }

async function records (url: string): Promise<Array<{ name: string, copies: number }>> {
  return await withClient(url, async client =>
    (await client.query<{ name: string, copies: number }>('SELECT name, count(*)::int AS copies FROM pgmigrations GROUP BY name ORDER BY name')).rows)
}

t.test('three runs at once on a fresh database: each migration applied and recorded once, no lock left', async t => {
  const url = await db.createDatabase()
  await Promise.all([1, 2, 3].map(async () => { await runMigrations(url, quiet) }))
  t.same(await records(url), (await migrationNames()).map(name => ({ name, copies: 1 })))
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  t.teardown(async () => { await client.end() })
  const { rowCount } = await client.query("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
  t.equal(rowCount, 0, 'the lock ended with the transaction')
})

t.test('a migration recorded twice (by concurrent starts before this lock) keeps neither readiness at 503 nor the next start from starting', async t => {
  const url = await db.createDatabase()
  const { app } = await testApp(t, url)
  const names = await migrationNames()
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  t.teardown(async () => { await client.end() })
  // One in the middle (node-pg-migrate's order check trips on it) and the last one.
  for (const name of [names[1], names[names.length - 1]]) await client.query('INSERT INTO pgmigrations (name, run_on) VALUES ($1, now())', [name])
  t.equal((await app.inject({ method: 'GET', url: '/health/ready' })).statusCode, 200, 'ready: every migration is applied, twice recorded or not')

  const warnings: string[] = []
  await runMigrations(url, { ...quiet, warn: (msg) => { warnings.push(msg) } })
  t.same(warnings, ['removed 2 duplicate records from pgmigrations'])
  t.same(await records(url), names.map(name => ({ name, copies: 1 })), 'one record per migration again')
  const { app: next } = await testApp(t, url)
  t.equal((await next.inject({ method: 'GET', url: '/health/ready' })).statusCode, 200, 'and the next instance starts and is ready')
})

t.test('an instance of the previous version keeps working through a rolling deploy: its Idempotency-Key statements still run after the operation column is added', async t => {
  const url = await db.createDatabase()
  await runMigrations(url, quiet)
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  t.teardown(async () => { await client.end() })
  const owner = Buffer.alloc(32, 1)
  // The previous version's record of an answer, as it sends it (no operation column; ON CONFLICT on the key it knows).
  const previous = `INSERT INTO idempotency_keys (key_owner, idempotency_key, request_hash, state, claim_token, locked_until, response_status, response_body, location, expires_at)
    VALUES ($1, $2, $3, 'done', gen_random_uuid(), now(), 201, '{}', '/v1/categories/1', now() + interval '24 hours')
    ON CONFLICT (key_owner, idempotency_key) DO UPDATE SET state = 'done'`
  await client.query(previous, [owner, 'rolling-1', Buffer.alloc(32, 2)])
  await client.query(previous, [owner, 'rolling-1', Buffer.alloc(32, 2)])
  const { rows } = await client.query<{ operation: string }>('SELECT operation FROM idempotency_keys WHERE idempotency_key = $1', ['rolling-1'])
  t.same(rows, [{ operation: 'createCategory' }], 'one record, and it is a createCategory record: the only operation the previous version had')
})
