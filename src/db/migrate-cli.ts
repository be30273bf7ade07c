import { loadConfig, ConfigError } from '../config.js'
import { runMigrations } from './migrate.js'

/** `npm run migrate`: apply pending migrations (on DATABASE_DIRECT_URL when set, else DATABASE_URL) and exit. */
try {
  const { databaseUrl, databaseDirectUrl, db } = loadConfig()
  if (databaseUrl === undefined) throw new ConfigError('DATABASE_URL must be set to run migrations')
  await runMigrations(databaseDirectUrl ?? databaseUrl, console, { statementTimeoutMs: db.statementTimeoutMs })
} catch (err) {
  console.error(err instanceof ConfigError ? err.message : err)
  process.exitCode = 1
}
