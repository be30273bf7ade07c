import { readdir } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { PG_MIGRATE_LOCK_ID, runner } from 'node-pg-migrate'
import pg from 'pg'
import type { Database } from './database.js'

export const MIGRATIONS_DIR = fileURLToPath(new URL('../../migrations', import.meta.url))
export const MIGRATIONS_TABLE = 'pgmigrations'

interface Logger { info: (msg: string) => void, warn: (msg: string) => void, error: (msg: string) => void }

/**
 * Applies every pending migration in one transaction, serialized across instances starting together by a
 * transaction-scoped advisory lock (node-pg-migrate's key): unlike its session lock, it holds through a transaction
 * pooler. node-pg-migrate runs inside that transaction (its BEGIN is only a warning), its COMMIT or ROLLBACK ends it.
 * `statementTimeoutMs` becomes the role's statement_timeout in this database: the server applies it through any pooler.
 */
export async function runMigrations (databaseUrl: string, logger: Logger,
  { statementTimeoutMs }: { statementTimeoutMs?: number } = {}): Promise<void> {
  const client = new pg.Client({ connectionString: databaseUrl, application_name: 'petstore-migrations' })
  // A lost connection fails the query in progress; unheard, its 'error' event would crash the process.
  client.on('error', () => {})
  await client.connect()
  try {
    await client.query('BEGIN')
    // The role's own statement_timeout must not cut a long migration (or the wait for the lock) short.
    await client.query('SET LOCAL statement_timeout = 0')
    await client.query('SELECT pg_advisory_xact_lock($1)', [String(PG_MIGRATE_LOCK_ID)])
    const endSession = statementTimeoutMs !== undefined && await setStatementTimeout(client, statementTimeoutMs, logger)
    await runner({
      dbClient: client,
      noLock: true,
      singleTransaction: true,
      dir: MIGRATIONS_DIR,
      direction: 'up',
      migrationsTable: MIGRATIONS_TABLE,
      logger
    })
    // Nothing to run: node-pg-migrate sent no COMMIT, and the transaction (the role setting) is still ours.
    await client.query('COMMIT')
    // Sessions keep the role's defaults from their start: behind a pooler this server connection would go on
    // with the old timeout, so it ends itself.
    if (endSession) await client.query('SELECT pg_terminate_backend(pg_backend_pid())').catch(() => {})
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {})
    throw err
  } finally {
    await client.end().catch(() => {})
  }
}

/**
 * Makes `ms` the role's statement_timeout in this database; true when that changed it. Never a superuser's:
 * that role is an operator's too, and the timeout would cut their imports and maintenance.
 */
async function setStatementTimeout (client: pg.Client, ms: number, logger: Logger): Promise<boolean> {
  type Role = { role: string, database: string, superuser: boolean, current: string[] | null }
  const { rows } = await client.query<Role>(`
    SELECT quote_ident(rolname) AS role, quote_ident(current_database()) AS database, rolsuper AS superuser,
      (SELECT setconfig FROM pg_db_role_setting JOIN pg_database d ON d.oid = setdatabase
       WHERE setrole = r.oid AND d.datname = current_database()) AS current
    FROM pg_roles r WHERE rolname = current_user`)
  const { role, database, superuser, current } = rows[0] as Role
  if (current?.includes(`statement_timeout=${ms}ms`) === true) return false
  const statement = `ALTER ROLE ${role} IN DATABASE ${database} SET statement_timeout = '${ms}ms'`
  if (superuser) {
    logger.warn(`DB_STATEMENT_TIMEOUT_MS: the service connects as ${role}, a superuser, whose settings would reach ` +
      'every operator session too: connect as a role of its own (docs/deployment.md), or set it for that role: ' +
      statement)
    return false
  }
  await client.query('SAVEPOINT statement_timeout')
  try {
    await client.query(statement)
    return true
  } catch (err) {
    await client.query('ROLLBACK TO SAVEPOINT statement_timeout')
    logger.warn(`DB_STATEMENT_TIMEOUT_MS: could not make ${ms} ms the statement_timeout of role ${role} ` +
      `(${(err as Error).message}); an operator can: ${statement}`)
    return false
  }
}

/** Warns when the pool's sessions do not run with the statement timeout (a pooler connecting as another role). */
export async function checkStatementTimeout (db: Database, ms: number, log: Pick<Console, 'warn'>): Promise<void> {
  const found = await db.query<{ setting: string, role: string }>(
    "SELECT setting, current_user AS role FROM pg_settings WHERE name = 'statement_timeout'")
    .then(({ rows }) => rows[0], () => undefined)
  if (found !== undefined && Number(found.setting) !== ms) {
    log.warn({ statementTimeoutMs: Number(found.setting), role: found.role },
      `DB_STATEMENT_TIMEOUT_MS is ${ms} but the database sessions run with statement_timeout ${found.setting} ms; ` +
      `set it for the role they connect as: ALTER ROLE ${found.role} SET statement_timeout = '${ms}ms'`)
  }
}

/** The names node-pg-migrate records for our migration files, to check that all are applied. */
export async function migrationNames (): Promise<string[]> {
  return (await readdir(MIGRATIONS_DIR)).filter(f => f.endsWith('.sql')).map(f => f.replace(/\.sql$/, '')).sort()
}
