import { loadConfig, ConfigError } from './config.js'
import { runMigrations } from './db/migrate.js'
import { describeBuildError } from './startup-checks.js'
import { reportStartupFailure } from './startup-error.js'

/** `npm run migrate` (`node dist/migrate.js` in the image): pending migrations, on the service's database. */
try {
  const config = loadConfig()
  const url = config.databaseDirectUrl ?? config.databaseUrl
  if (url === undefined) throw new ConfigError('DATABASE_URL must be set to run migrations')
  await runMigrations(url, console, { statementTimeoutMs: config.db.statementTimeoutMs })
    .catch((err: unknown) => { throw describeBuildError(err, url) })
} catch (err) {
  reportStartupFailure(err, process.env.LOG_LEVEL)
  process.exitCode = 1
}
