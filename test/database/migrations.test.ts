import { PG_MIGRATE_LOCK_ID, runner } from 'node-pg-migrate'
import pg from 'pg'
import t from 'tap'
import { MIGRATIONS_DIR, MIGRATIONS_TABLE, migrationNames, runMigrations } from '../../src/db/migrate.js'
import { testDatabase } from '../helpers/database.js'
import { withClient } from '../helpers/pg-client.js'

/*
 * Migrations at start (src/db/migrate.ts): one transaction under a transaction-scoped
 * advisory lock. Through PgBouncer: test/topology/pgbouncer.test.ts.
 */

const db = await testDatabase(t)
const quiet = { info () {}, warn () {}, error () {} }

async function records (url: string): Promise<Array<{ name: string; copies: number }>> {
  return await withClient(
    url,
    async client =>
      (
        await client.query<{ name: string; copies: number }>(
          'SELECT name, count(*)::int AS copies FROM pgmigrations GROUP BY name ORDER BY name'
        )
      ).rows
  )
}

t.test('the baseline on an empty database: the 1.0 schema; every down migration leaves nothing behind', async t => {
  const url = await db.createDatabase()
  const schema = async (): Promise<string[]> =>
    await withClient(url, async client =>
      (
        await client.query<{ name: string }>(`
    SELECT 'table ' || table_name AS name FROM information_schema.tables WHERE table_schema = 'public'
    UNION ALL SELECT 'trigger ' || tgname FROM pg_trigger WHERE NOT tgisinternal
    UNION ALL SELECT 'function ' || proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace
    ORDER BY name`)
      ).rows.map(row => row.name)
    )
  const migrate = async (direction: 'up' | 'down', count: number): Promise<void> => {
    await runner({
      databaseUrl: url,
      dir: MIGRATIONS_DIR,
      migrationsTable: MIGRATIONS_TABLE,
      direction,
      count,
      logger: { ...quiet, debug () {} }
    })
  }
  t.same(await schema(), [], 'empty')
  // The baseline is released and never changes; later migrations (a new resource's too) are added after it.
  t.equal((await migrationNames())[0], '1764720000000_baseline', 'the baseline comes first')
  await migrate('up', 1)
  t.same(await schema(), [
    'function notify_table_change',
    'function notify_table_insert',
    'table categories',
    'table idempotency_keys',
    'table pgmigrations',
    'trigger categories_changed',
    'trigger categories_inserted'
  ])
  await runMigrations(url, quiet)
  t.same(
    (await records(url)).map(record => record.name),
    await migrationNames(),
    'then every later one'
  )
  await migrate('down', Infinity)
  t.same(await schema(), ['table pgmigrations'])
})

t.test('three runs at once on a fresh database: each migration applied and recorded once, no lock left', async t => {
  const url = await db.createDatabase()
  await Promise.all(
    [1, 2, 3].map(async () => {
      await runMigrations(url, quiet)
    })
  )
  t.same(
    await records(url),
    (await migrationNames()).map(name => ({ name, copies: 1 }))
  )
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  t.teardown(async () => {
    await client.end()
  })
  const { rowCount } = await client.query(`SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
  t.equal(rowCount, 0, 'the lock ended with the transaction')
})

t.test(
  "DB_STATEMENT_TIMEOUT_MS becomes the role's statement_timeout in this database; " +
    'the migrations themselves run without it',
  async t => {
    const url = await db.createDatabase()
    const other = await db.createDatabase()
    const timeoutOf = async (target: string): Promise<string> =>
      await withClient(
        target,
        async client =>
          (await client.query<{ setting: string }>("SELECT setting FROM pg_settings WHERE name = 'statement_timeout'"))
            .rows[0]?.setting ?? ''
      )
    const sessions = async (): Promise<number> =>
      await withClient(
        other,
        async client =>
          (
            await client.query<{ n: number }>(
              `SELECT count(*)::int AS n FROM pg_stat_activity
              WHERE application_name = 'petstore-migrations' AND datname = $1`,
              [new URL(url).pathname.slice(1)]
            )
          ).rows[0]?.n ?? -1
      )

    await runMigrations(url, quiet, { statementTimeoutMs: 1234 })
    t.equal(await timeoutOf(url), '1234', 'a new session of the role has it')
    t.equal(await timeoutOf(other), '0', 'only in this database')
    t.equal(await sessions(), 0, 'the run leaves no session behind')

    await runMigrations(url, quiet, { statementTimeoutMs: 1234 })
    await runMigrations(url, quiet, { statementTimeoutMs: 700 })
    t.equal(await timeoutOf(url), '700', 'a start with another value changes it')
    await runMigrations(url, quiet)
    t.equal(await timeoutOf(url), '700', 'a run without a value leaves it as it is')

    // A run that waits longer than the role's timeout (here for the migration lock another start holds) still
    // completes.
    await runMigrations(url, quiet, { statementTimeoutMs: 300 })
    t.equal(await timeoutOf(url), '300')
    const holder = new pg.Client({ connectionString: url })
    await holder.connect()
    t.teardown(async () => {
      await holder.end()
    })
    await holder.query('BEGIN')
    await holder.query('SET LOCAL statement_timeout = 0')
    await holder.query('SELECT pg_advisory_xact_lock($1)', [String(PG_MIGRATE_LOCK_ID)])
    const started = performance.now()
    const waiting = runMigrations(url, quiet, { statementTimeoutMs: 300 })
    setTimeout(() => {
      holder.query('COMMIT').catch(() => {})
    }, 1000)
    await waiting
    t.ok(
      performance.now() - started >= 900,
      "the run waited a second for the lock, past the role's 300 ms, and completed"
    )
    await t.rejects(
      withClient(url, async client => {
        await client.query('SELECT pg_sleep(1)')
      }),
      { code: '57014' },
      "outside the run, the role's timeout cancels a slow statement"
    )
  }
)

t.test("a superuser's settings are never changed: the warning prints the statement for an operator", async t => {
  const url = await db.createDatabase()
  const warnings: string[] = []
  await runMigrations(
    db.adminUrlFor(url),
    {
      ...quiet,
      warn: message => {
        warnings.push(message)
      }
    },
    { statementTimeoutMs: 4321 }
  )
  const settings = await withClient(
    db.adminUrlFor(url),
    async client =>
      (await client.query<{ setting: string }>("SELECT setting FROM pg_settings WHERE name = 'statement_timeout'"))
        .rows[0]?.setting
  )
  t.equal(settings, '0', "the superuser's sessions keep no timeout")
  t.equal(warnings.length, 1)
  t.match(
    warnings[0],
    new RegExp(
      '^DB_STATEMENT_TIMEOUT_MS: the service connects as \\S+, a superuser, ' +
        'whose settings would reach every operator session too: ' +
        'connect as a role of its own \\(docs/deployment\\.md\\), or set it for that role: ' +
        "ALTER ROLE \\S+ IN DATABASE petstore_test_[0-9a-f]+ SET statement_timeout = '4321ms'$"
    )
  )
})
