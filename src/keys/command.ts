import path from 'node:path'
import { loadConfig, sha256, type Config } from '../config.js'
import { Database } from '../db/database.js'
import { DatabaseUnavailableError } from '../db/errors.js'
import { runMigrations } from '../db/migrate.js'
import { loadEmbedded } from '../embedded.js'
import { checkDatabase, describeBuildError } from '../startup-checks.js'
import { StartupError } from '../startup-error.js'
import { parse, HELP, type NewKey, type Request } from './arguments.js'
import { generateKey, keyPrefix } from './store.js'

// `npm run keys -- ...` (`node dist/keys/command.js ...` in the image): issue, list and revoke managed API keys.

/** As toISOString writes it, but by PostgreSQL: a time past a Date's last day (older commands wrote some) is shown. */
const iso = (column: string): string => `to_char(${column} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`

/** The service's database; without DATABASE_URL the running service's embedded one, or one started for this. */
async function connect (config: Config): Promise<{ url: string, stop: () => Promise<void> }> {
  const url = config.databaseDirectUrl ?? config.databaseUrl
  if (url !== undefined) {
    await checkDatabase(url)
    return { url, stop: async () => {} }
  }
  const dir = path.resolve(config.dataDir)
  const { refused, runningServiceUrl, startEmbeddedPostgres } = await loadEmbedded()
  const running = await runningServiceUrl(dir).catch(refused)
  if (running !== undefined) return { url: running, stop: async () => {} }
  process.stderr.write(`keys: DATABASE_URL is not set; starting the embedded PostgreSQL (data in ${dir})\n`)
  const embedded = await startEmbeddedPostgres({ dir }).catch(refused)
  const quiet = { info: () => {}, warn: () => {}, error: () => {} }
  await runMigrations(embedded.serviceUrl, quiet).catch(async (err: unknown) => {
    await embedded.stop()
    throw err
  })
  return { url: embedded.serviceUrl, stop: embedded.stop }
}

async function create (db: Database, { name, scope, expiresInDays, ratePerMinute }: NewKey): Promise<void> {
  const key = generateKey()
  const { rows } = await db.query<{ id: bigint, expires: string | null }>(`
    INSERT INTO api_keys (name, scope, prefix, digest, expires_at, rate_limit_per_minute)
    VALUES ($1, $2, $3, $4, now() + $5::float8 * interval '1 day', $6) RETURNING id, ${iso('expires_at')} AS expires`,
  [name, scope, keyPrefix(key), sha256(key), expiresInDays, ratePerMinute])
  const row = rows[0] as { id: bigint, expires: string | null }
  const expiry = row.expires === null ? 'never expires' : `expires ${row.expires}`
  process.stdout.write(`created key ${row.id} "${name}" (${scope} scope, ${expiry}); ` +
    'it is shown this once, only its SHA-256 is kept:\n' + key + '\n')
}

async function list (db: Database, json: boolean): Promise<void> {
  const { rows } = await db.query(`
    SELECT id, name, scope, prefix, rate_limit_per_minute AS "rateLimitPerMinute", ${iso('created_at')} AS "createdAt",
      ${iso('expires_at')} AS "expiresAt", ${iso('revoked_at')} AS "revokedAt", ${iso('last_used_at')} AS "lastUsedAt"
    FROM api_keys ORDER BY id`)
  const shown = rows.map(row => ({ ...row, id: Number(row.id) }))
  if (json) {
    process.stdout.write(JSON.stringify(shown, null, 2) + '\n')
    return
  }
  const table = [['id', 'name', 'scope', 'prefix', 'rate/min', 'created', 'expires', 'revoked', 'last used'],
    ...shown.map(key => Object.values(key).map(value => String(value ?? '-')))]
  const widths = table[0]?.map((_, i) => Math.max(...table.map(line => line[i]?.length ?? 0))) ?? []
  const lines = table.map(line => line.map((cell, i) => cell.padEnd(widths[i] ?? 0)).join('  ').trimEnd())
  process.stdout.write(lines.join('\n') + '\n')
}

async function revoke (db: Database, id: string): Promise<void> {
  const { rows } = await db.query<{ revoked: string, now: boolean }>(`
    WITH revoked AS (UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL RETURNING revoked_at)
    SELECT ${iso('revoked_at')} AS revoked, true AS now FROM revoked
    UNION ALL SELECT ${iso('revoked_at')}, false FROM api_keys WHERE id = $1 AND revoked_at IS NOT NULL`, [id])
  const row = rows[0]
  if (row === undefined) throw new StartupError(`no API key with id ${id}; keys list shows the ids`)
  const done = row.now ? 'revoked' : 'was already revoked'
  process.stdout.write(`key ${id} ${done} at ${row.revoked}\n`)
}

function describe (err: unknown, url: string | undefined): string {
  if (err instanceof StartupError) return err.message
  const cause = err instanceof DatabaseUnavailableError ? err.cause : err
  if ((cause as { code?: string }).code === '42P01') {
    return 'the api_keys table does not exist: apply the migrations first (npm run migrate, node dist/migrate.js)'
  }
  return url === undefined ? String((cause as Error).message) : describeBuildError(cause, url).message
}

let url: string | undefined

async function manage (request: Exclude<Request, { command: 'help' }>): Promise<void> {
  // A production environment need not name a static key to manage the others.
  const config = loadConfig({ ...process.env, NODE_ENV: undefined })
  const database = await connect(config)
  url = database.url
  const db = new Database({
    ...config.db, connectionString: url, applicationName: 'petstore-keys', max: 1, maxWaiting: 1, log: () => {}
  })
  try {
    if (request.command === 'create') await create(db, request.key)
    else if (request.command === 'list') await list(db, request.json)
    else await revoke(db, request.id)
  } finally {
    await db.end()
    await database.stop()
  }
}

// A reader that stops early (keys list | head) is no failure: what it did not read is dropped.
process.stdout.on('error', (err: NodeJS.ErrnoException) => { if (err.code !== 'EPIPE') throw err })

try {
  const request = parse(process.argv.slice(2))
  if (request.command === 'help') process.stdout.write(HELP)
  else await manage(request)
} catch (err) {
  process.stderr.write(`keys: ${describe(err, url).replace(/\s*\n\s*/g, ' ')}\n`)
  process.exitCode = 1
}
