import { readdir } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { PG_MIGRATE_LOCK_ID, runner } from 'node-pg-migrate'
import pg from 'pg'

export const MIGRATIONS_DIR = fileURLToPath(new URL('../../migrations', import.meta.url))
export const MIGRATIONS_TABLE = 'pgmigrations'

interface Logger { info: (msg: string) => void, warn: (msg: string) => void, error: (msg: string) => void }

/** What node-pg-migrate sends to open and close its single transaction; here the transaction is ours. */
const RUNNER_TRANSACTION_CONTROL = new Set(['BEGIN', 'COMMIT', 'ROLLBACK'])

/**
 * Applies every pending migration, serialized across instances starting together.
 *
 * The whole run is one transaction that first takes a transaction-scoped advisory
 * lock (pg_advisory_xact_lock), then reads pgmigrations, applies what is missing and
 * records it. node-pg-migrate's own lock is a session lock: behind a transaction
 * pooler it is taken on one server connection and released on another (or never),
 * so instances applied the same migration twice, leaked locks and hung. A
 * transaction stays on one server connection through any pooler, its lock ends with
 * it (COMMIT, ROLLBACK, or a lost connection), and a run that fails leaves nothing
 * half applied. The key is node-pg-migrate's, so an older instance taking its
 * session lock directly still waits for us and we for it.
 *
 * Every migration must therefore run inside a transaction (plain SQL files do; a
 * CREATE INDEX CONCURRENTLY would need its own runner).
 */
export async function runMigrations (databaseUrl: string, logger: Logger): Promise<void> {
  const client = new pg.Client({ connectionString: databaseUrl, application_name: 'petstore-migrations' })
  // A lost connection fails the query in progress; unheard, its 'error' event would crash the process.
  client.on('error', () => {})
  await client.connect()
  try {
    await client.query('BEGIN')
    await client.query('SELECT pg_advisory_xact_lock($1)', [String(PG_MIGRATE_LOCK_ID)])
    await removeDuplicateRecords(client, logger)
    await runner({
      dbClient: insideOurTransaction(client),
      noLock: true,
      singleTransaction: true,
      dir: MIGRATIONS_DIR,
      direction: 'up',
      migrationsTable: MIGRATIONS_TABLE,
      checkOrder: true,
      logger: { debug: () => {}, info: logger.info, warn: logger.warn, error: logger.error }
    })
    await client.query('COMMIT')
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {})
    throw err
  } finally {
    await client.end().catch(() => {})
  }
}

/** The client node-pg-migrate gets: its BEGIN, COMMIT and ROLLBACK would end our transaction (and the lock) early, so they are ours to send. */
function insideOurTransaction (client: pg.Client): pg.ClientBase {
  const query = async (text: unknown, values?: unknown[]): Promise<unknown> =>
    RUNNER_TRANSACTION_CONTROL.has(String(text)) ? { rows: [] } : await client.query(text as string, values)
  return { query } as unknown as pg.ClientBase
}

/**
 * Concurrent starts without a working lock (before this runner) could record a
 * migration twice; node-pg-migrate's order check then refuses to start. The second
 * record of a name is only ever such a duplicate: keep the first.
 */
async function removeDuplicateRecords (client: pg.Client, logger: Logger): Promise<void> {
  const { rows } = await client.query<{ exists: boolean }>('SELECT to_regclass($1) IS NOT NULL AS exists', [MIGRATIONS_TABLE])
  if (rows[0]?.exists !== true) return
  const { rowCount } = await client.query(`DELETE FROM ${MIGRATIONS_TABLE} a USING ${MIGRATIONS_TABLE} b WHERE a.name = b.name AND a.id > b.id`)
  if ((rowCount ?? 0) > 0) logger.warn(`removed ${rowCount ?? 0} duplicate records from ${MIGRATIONS_TABLE}`)
}

/** The names node-pg-migrate records for our migration files, to check that all are applied. */
export async function migrationNames (): Promise<string[]> {
  const files = await readdir(MIGRATIONS_DIR)
  return files.filter(f => f.endsWith('.sql')).map(f => f.replace(/\.sql$/, '')).sort()
}
