import { readdir } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { runner } from 'node-pg-migrate'

export const MIGRATIONS_DIR = fileURLToPath(new URL('../../migrations', import.meta.url))
export const MIGRATIONS_TABLE = 'pgmigrations'

interface Logger { info: (msg: string) => void, warn: (msg: string) => void, error: (msg: string) => void }

/**
 * Applies every pending migration. Several instances may start together: the
 * advisory lock in 'wait' mode makes the others wait instead of failing.
 */
export async function runMigrations (databaseUrl: string, logger: Logger): Promise<void> {
  await runner({
    databaseUrl,
    dir: MIGRATIONS_DIR,
    direction: 'up',
    migrationsTable: MIGRATIONS_TABLE,
    advisoryLockMode: 'wait',
    checkOrder: true,
    logger: { debug: () => {}, info: logger.info, warn: logger.warn, error: logger.error }
  })
}

/** The names node-pg-migrate records for our migration files, to check that all are applied. */
export async function migrationNames (): Promise<string[]> {
  const files = await readdir(MIGRATIONS_DIR)
  return files.filter(f => f.endsWith('.sql')).map(f => f.replace(/\.sql$/, '')).sort()
}
