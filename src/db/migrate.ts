import { readdir } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { PG_MIGRATE_LOCK_ID, runner } from 'node-pg-migrate'
import pg from 'pg'
import type { Database } from './database.js'

export const MIGRATIONS_DIR = fileURLToPath(new URL('../../migrations', import.meta.url))
export const MIGRATIONS_TABLE = 'pgmigrations'

interface Logger { info: (msg: string) => void, warn: (msg: string) => void, error: (msg: string) => void }

export interface MigrationOptions {
  /**
   * DB_STATEMENT_TIMEOUT_MS, made the default of the connecting role in this database
   * (`ALTER ROLE ... IN DATABASE ... SET statement_timeout`): the server then applies it
   * to every session the service opens, through any pooler. Unset: left as it is.
   */
  statementTimeoutMs?: number
}

/** Transaction control node-pg-migrate sends; here the transaction is ours (see below). */
const TRANSACTION_CONTROL = /^\s*(BEGIN|START\s+TRANSACTION|COMMIT|END|ROLLBACK|ABORT)\s*;?\s*$/i

/**
 * Applies every pending migration, serialized across instances starting together.
 *
 * The whole run is one transaction that first takes a transaction-scoped advisory
 * lock (node-pg-migrate's own lock is a session lock: behind a transaction pooler it
 * is taken on one server connection and released on another, or never). A
 * transaction stays on one server connection through any pooler, its lock ends with
 * it, and a run that fails leaves nothing half applied. The key is node-pg-migrate's.
 * Every migration must therefore run inside a transaction (plain SQL files do).
 */
export async function runMigrations (databaseUrl: string, logger: Logger, options: MigrationOptions = {}): Promise<void> {
  const client = new pg.Client({ connectionString: databaseUrl, application_name: 'petstore-migrations' })
  // A lost connection fails the query in progress; unheard, its 'error' event would crash the process.
  client.on('error', () => {})
  await client.connect()
  let endSession = false
  try {
    await client.query('BEGIN')
    // The role's statement_timeout (below) must not cut a long migration short.
    await client.query('SET LOCAL statement_timeout = 0')
    await client.query('SELECT pg_advisory_xact_lock($1)', [String(PG_MIGRATE_LOCK_ID)])
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
    if (options.statementTimeoutMs !== undefined) endSession = await setStatementTimeout(client, options.statementTimeoutMs, logger)
    await client.query('COMMIT')
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {})
    throw err
  }
  try {
    // A session keeps the role's defaults from its start. Behind a pooler the server connection this ran on
    // would go on serving with the old timeout: when it changed, this session ends itself, and the pooler drops it.
    if (endSession) await client.query('SELECT pg_terminate_backend(pg_backend_pid())').catch(() => {})
  } finally {
    await client.end().catch(() => {})
  }
}

/**
 * Makes `ms` the role's statement_timeout in this database; true when that changed it. A role may set its own
 * defaults; where an operator forbids it, the start goes on with a warning (the client-side timeout still bounds waits).
 */
async function setStatementTimeout (client: pg.Client, ms: number, logger: Logger): Promise<boolean> {
  const wanted = `statement_timeout=${ms}ms`
  const { rows } = await client.query<{ settings: string[] | null }>(
    `SELECT setconfig AS settings FROM pg_db_role_setting
     WHERE setrole = (SELECT oid FROM pg_roles WHERE rolname = current_user) AND setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())`)
  if (rows[0]?.settings?.includes(wanted) === true) return false
  const { rows: names } = await client.query<{ role: string, database: string }>('SELECT quote_ident(current_user) AS role, quote_ident(current_database()) AS database')
  const { role, database } = names[0] as { role: string, database: string }
  await client.query('SAVEPOINT statement_timeout')
  try {
    await client.query(`ALTER ROLE ${role} IN DATABASE ${database} SET statement_timeout = '${ms}ms'`)
    return true
  } catch (err) {
    await client.query('ROLLBACK TO SAVEPOINT statement_timeout')
    logger.warn(`DB_STATEMENT_TIMEOUT_MS: could not make ${ms} ms the statement_timeout of role ${role} (${(err as Error).message}); an operator can: ALTER ROLE ${role} IN DATABASE ${database} SET statement_timeout = '${ms}ms'`)
    return false
  }
}

/**
 * Warns when the sessions DATABASE_URL leads to do not have the statement timeout (a pooler that connects
 * as another role, or server connections it opened before the setting): the server then cancels nothing,
 * and only the client-side timeout bounds a slow statement.
 */
export async function checkStatementTimeout (db: Database, ms: number, log: { warn: (fields: object, message: string) => void }): Promise<void> {
  const found = await db.query<{ setting: string, role: string }>("SELECT setting, current_user AS role FROM pg_settings WHERE name = 'statement_timeout'")
    .then(({ rows }) => rows[0], () => undefined)
  if (found !== undefined && Number(found.setting) !== ms) {
    log.warn({ statementTimeoutMs: Number(found.setting), role: found.role },
      `DB_STATEMENT_TIMEOUT_MS is ${ms} but the database sessions run with statement_timeout ${found.setting} ms; set it for the role they connect as: ALTER ROLE ${found.role} SET statement_timeout = '${ms}ms'`)
  }
}

/** The client node-pg-migrate gets: its transaction control would end our transaction (and the lock) early, so it is ours to send. */
function insideOurTransaction (client: pg.Client): pg.ClientBase {
  const query = async (text: unknown, values?: unknown[]): Promise<unknown> =>
    typeof text === 'string' && TRANSACTION_CONTROL.test(text) ? { rows: [] } : await client.query(text as string, values)
  return { query } as unknown as pg.ClientBase
}

/** The names node-pg-migrate records for our migration files, to check that all are applied. */
export async function migrationNames (): Promise<string[]> {
  const files = await readdir(MIGRATIONS_DIR)
  return files.filter(f => f.endsWith('.sql')).map(f => f.replace(/\.sql$/, '')).sort()
}
