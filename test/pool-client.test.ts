import pg from 'pg'
import t from 'tap'
import { poolClientClass } from '../src/db/pool-client.js'
import { createPool } from '../src/db/pool.js'
import { testDatabase } from './helpers/database.js'

/*
 * How the pool's connections send statements (src/db/pool-client.ts): the statement
 * timeout travels with each statement, not as a startup parameter, and statements are
 * prepared under a name only with DB_PREPARED_STATEMENTS. Here on a direct
 * connection; through PgBouncer in test/topology/pgbouncer.test.ts.
 */

const db = await testDatabase(t)

/** One connection per pool: every statement of a test runs on the same server session. */
function onePool (preparedStatements: boolean): pg.Pool {
  const pool = createPool({ connectionString: db.url, max: 1, connectionTimeoutMs: 2000, statementTimeoutMs: 200, preparedStatements }, () => {})
  t.teardown(async () => { await pool.end() })
  return pool
}

/** A query on the session as it is, without the timeout prefix (a raw pg.Query passes through unchanged). */
async function raw<R> (client: pg.PoolClient, text: string): Promise<R[]> {
  const query = new pg.Query(text)
  const rows: R[] = []
  return await new Promise((resolve, reject) => {
    query.on('row', (row: R) => { rows.push(row) })
    query.on('end', () => { resolve(rows) })
    query.on('error', reject)
    client.query(query)
  })
}

async function withClient<T> (pool: pg.Pool, work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect()
  try {
    return await work(client)
  } finally {
    client.release()
  }
}

const prepared = async (client: pg.PoolClient): Promise<string[]> =>
  (await raw<{ statement: string }>(client, 'SELECT statement FROM pg_prepared_statements ORDER BY statement')).map(r => r.statement)

for (const preparedStatements of [false, true]) {
  t.test(`DB_PREPARED_STATEMENTS=${String(preparedStatements)}`, async t => {
    const pool = onePool(preparedStatements)

    t.test('a slow statement is canceled by the server (57014) after the timeout', async t => {
      const started = performance.now()
      await t.rejects(pool.query('SELECT pg_sleep(2)'), { code: '57014' })
      t.ok(performance.now() - started < 1500, 'long before the statement would have ended')
      for (let i = 0; i < 2; i++) await t.rejects(pool.query('SELECT pg_sleep($1)', [2]), { code: '57014' }, `with parameters too (${i === 0 ? 'first use' : 'again'})`)
    })

    t.test('inside a transaction every statement runs under it, and ROLLBACK still gets through', async t => {
      await withClient(pool, async client => {
        await client.query('BEGIN')
        t.same((await client.query('SELECT current_setting($1) AS timeout', ['statement_timeout'])).rows, [{ timeout: '200ms' }])
        await t.rejects(client.query('SELECT pg_sleep(2)'), { code: '57014' })
        await client.query('ROLLBACK')
        t.same(await raw(client, 'SHOW statement_timeout'), [{ statement_timeout: '0' }], 'nothing outlives the transaction: the session keeps its own setting')
      })
    })

    t.test('results come back as without the prefix: rows, row counts, commands, callbacks', async t => {
      t.same((await pool.query('SELECT 1 AS one, $1::text AS two', ['2'])).rows, [{ one: 1, two: '2' }])
      t.equal((await pool.query('CREATE TEMP TABLE IF NOT EXISTS timeout_probe (n int)')).command, 'CREATE')
      const inserted = await pool.query('INSERT INTO timeout_probe SELECT generate_series(1, $1::int)', [3])
      t.equal(inserted.command, 'INSERT')
      t.equal(inserted.rowCount, 3)
      await withClient(pool, async client => {
        const viaCallback = await new Promise<pg.QueryResult>((resolve, reject) => {
          client.query('SELECT 42 AS answer', (err: Error | undefined, result: pg.QueryResult) => { if (err !== undefined && err !== null) reject(err); else resolve(result) })
        })
        t.same(viaCallback.rows, [{ answer: 42 }])
        await t.rejects(client.query('SELECT 1/$1::int', [0]), { code: '22012' }, 'an error in the statement is that statement\'s error')
        t.same((await client.query('SELECT 2 AS after')).rows, [{ after: 2 }], 'and the connection goes on')
      })
    })

    t.test(preparedStatements ? 'statements with parameters are prepared once per connection, under names of their own' : 'no statement is prepared under a name, whatever the caller asks', async t => {
      await withClient(pool, async client => {
        for (let i = 0; i < 3; i++) t.same((await client.query({ name: 'the-callers-name', text: 'SELECT $1::int AS n', values: [i] })).rows, [{ n: i }])
        const statements = await prepared(client)
        if (preparedStatements) {
          t.ok(statements.includes('SELECT $1::int AS n'), 'prepared')
          t.ok(statements.some(s => s.includes("set_config('statement_timeout'")), 'and so is the timeout\'s own statement')
          t.notOk((await raw<{ name: string }>(client, 'SELECT name FROM pg_prepared_statements')).some(r => r.name === 'the-callers-name'), 'under the pool\'s name, not the caller\'s')
        } else {
          t.same(statements, [], 'nothing prepared')
        }
      })
    })

    t.test('a statement whose first Parse fails (here: behind a table lock, under the timeout) works once the lock is gone', async t => {
      await pool.query('CREATE TABLE IF NOT EXISTS parse_probe (n int)')
      const locker = new pg.Client({ connectionString: db.url })
      await locker.connect()
      t.teardown(async () => { await locker.end() })
      const insert = `INSERT INTO parse_probe VALUES ($1) -- ${String(preparedStatements)}`
      await locker.query('BEGIN')
      await locker.query('LOCK TABLE parse_probe IN ACCESS EXCLUSIVE MODE')
      // A checked-out client keeps its connection after an error (pool.query would discard it).
      await withClient(pool, async client => {
        await t.rejects(client.query(insert, [1]), { code: '57014' }, 'the Parse itself waits for the lock, and is canceled')
        await locker.query('ROLLBACK')
        t.equal((await client.query(insert, [2])).rowCount, 1, 'not "prepared statement does not exist"')
      })
    })

    t.test('a statement first used in a failed transaction works after ROLLBACK', async t => {
      // A fresh connection: the timeout's own statement is first sent in the failed transaction too.
      await withClient(onePool(preparedStatements), async client => {
        await client.query('BEGIN')
        await t.rejects(client.query('RELEASE SAVEPOINT none_such'), { code: '3B001' }, 'transaction control goes through as it is, and fails')
        const text = `SELECT $1::int + 1 AS next -- ${String(preparedStatements)}`
        await t.rejects(client.query(text, [1]), { code: '25P02' }, 'refused: the transaction is aborted')
        await client.query('ROLLBACK')
        t.same((await client.query(text, [1])).rows, [{ next: 2 }], 'not "prepared statement does not exist"')
      })
    })
  })
}

t.test('each statement runs under the writer\'s application_name, whatever the session was given (a pooler may pass on another client\'s)', async t => {
  const Client = poolClientClass({ statementTimeoutMs: 1000, preparedStatements: false, applicationName: 'petstore/the-writer' })
  const pool = new pg.Pool({ connectionString: db.url, max: 1, application_name: 'another-client', Client })
  t.teardown(async () => { await pool.end() })
  t.same((await pool.query('SELECT current_setting($1) AS name', ['application_name'])).rows, [{ name: 'petstore/the-writer' }], 'the change notifications name this writer')
  await withClient(pool, async client => {
    t.same(await raw(client, 'SHOW application_name'), [{ application_name: 'another-client' }], 'and nothing outlives the statement')
  })
})
