import path from 'node:path'
import { parseArgs } from 'node:util'
import { loadConfig, sha256, type Config } from '../config.js'
import { Database } from '../db/database.js'
import { DatabaseUnavailableError } from '../db/errors.js'
import { runMigrations } from '../db/migrate.js'
import { loadEmbedded } from '../embedded.js'
import { checkDatabase, describeBuildError } from '../startup-checks.js'
import { StartupError } from '../startup-error.js'
import { generateKey, keyPrefix } from './store.js'

/** `npm run keys -- ...` (`node dist/keys/command.js ...` in the image): issue, list and revoke managed API keys. */
const USAGE = 'usage: keys create --name NAME --scope read|write [--expires-in DAYS] [--rate-limit N] | ' +
  'keys list [--json] | keys revoke ID'
const fail = (message: string): never => { throw new StartupError(message) }

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
  await runMigrations(embedded.serviceUrl, quiet).catch(async (err: unknown) => { await embedded.stop(); throw err })
  return { url: embedded.serviceUrl, stop: embedded.stop }
}

type Option = 'name' | 'scope' | 'expires-in' | 'rate-limit'

async function create (db: Database, values: Partial<Record<Option, string>>): Promise<void> {
  const name = values.name?.trim() ?? ''
  if (name === '' || name.length > 255) fail('--name must be given, 1 to 255 characters')
  if (values.scope !== 'read' && values.scope !== 'write') fail('--scope must be read or write')
  const number = (option: Option, integer: boolean): number | null => {
    if (values[option] === undefined) return null
    const n = Number(values[option])
    if (!(n > 0 && Number.isFinite(n)) || (integer && !Number.isSafeInteger(n))) {
      fail(`--${option} must be a positive ${integer ? 'whole ' : ''}number`)
    }
    return n
  }
  const key = generateKey()
  const { rows } = await db.query<{ id: bigint, expires: Date | null }>(`
    INSERT INTO api_keys (name, scope, prefix, digest, expires_at, rate_limit_per_minute)
    VALUES ($1, $2, $3, $4, now() + $5::float8 * interval '1 day', $6) RETURNING id, expires_at AS expires`,
  [name, values.scope, keyPrefix(key), sha256(key), number('expires-in', false), number('rate-limit', true)])
  const row = rows[0] as { id: bigint, expires: Date | null }
  const expiry = row.expires === null ? 'never expires' : `expires ${row.expires.toISOString()}`
  process.stdout.write(`created key ${row.id} "${name}" (${String(values.scope)} scope, ${expiry}); ` +
    'it is shown this once, only its SHA-256 is kept:\n' + key + '\n')
}

async function list (db: Database, json: boolean): Promise<void> {
  const { rows } = await db.query(`
    SELECT id, name, scope, prefix, rate_limit_per_minute AS "rateLimitPerMinute", created_at AS "createdAt",
      expires_at AS "expiresAt", revoked_at AS "revokedAt", last_used_at AS "lastUsedAt" FROM api_keys ORDER BY id`)
  const shown = rows.map(row => ({ ...row, id: Number(row.id) }))
  if (json) {
    process.stdout.write(JSON.stringify(shown, null, 2) + '\n')
    return
  }
  const cell = (value: unknown): string => value instanceof Date ? value.toISOString() : String(value ?? '-')
  const table = [['id', 'name', 'scope', 'prefix', 'rate/min', 'created', 'expires', 'revoked', 'last used'],
    ...shown.map(key => Object.values(key).map(cell))]
  const widths = table[0]?.map((_, i) => Math.max(...table.map(line => line[i]?.length ?? 0))) ?? []
  for (const line of table) process.stdout.write(line.map((cell, i) => cell.padEnd(widths[i] ?? 0)).join('  ') + '\n')
}

async function revoke (db: Database, id: string | undefined): Promise<void> {
  if (id === undefined || !/^[1-9][0-9]{0,17}$/.test(id)) fail(`revoke needs the key's id (from keys list); ${USAGE}`)
  const { rows } = await db.query<{ revoked: Date, now: boolean }>(`
    WITH revoked AS (UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL RETURNING revoked_at)
    SELECT revoked_at AS revoked, true AS now FROM revoked
    UNION ALL SELECT revoked_at, false FROM api_keys WHERE id = $1 AND revoked_at IS NOT NULL`, [id])
  const row = rows[0] ?? fail(`no API key with id ${String(id)}; keys list shows the ids`)
  const done = row.now ? 'revoked' : 'was already revoked'
  process.stdout.write(`key ${String(id)} ${done} at ${row.revoked.toISOString()}\n`)
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
try {
  const { values, positionals: [command, id] } = parseArgs({
    allowPositionals: true,
    options: {
      name: { type: 'string' },
      scope: { type: 'string' },
      'expires-in': { type: 'string' },
      'rate-limit': { type: 'string' },
      json: { type: 'boolean' }
    }
  })
  if (!['create', 'list', 'revoke'].includes(command ?? '')) fail(USAGE)
  // A production environment need not name a static key to manage the others.
  const config = loadConfig({ ...process.env, NODE_ENV: undefined })
  const database = await connect(config)
  url = database.url
  const db = new Database({
    ...config.db, connectionString: url, applicationName: 'petstore-keys', max: 1, maxWaiting: 1, log: () => {}
  })
  try {
    if (command === 'create') await create(db, values)
    else if (command === 'list') await list(db, values.json === true)
    else await revoke(db, id)
  } finally {
    await db.end()
    await database.stop()
  }
} catch (err) {
  const line = err instanceof TypeError && 'code' in err ? `${err.message}; ${USAGE}` : describe(err, url)
  process.stderr.write(`keys: ${line.replace(/\s*\n\s*/g, ' ')}\n`)
  process.exitCode = 1
}
