import { hash } from 'node:crypto'
import { Type, type Static } from 'typebox'
import envSchema from 'env-schema'
import { StartupError } from './startup-error.js'

/** Every environment variable the service reads, with its default. The README's table mirrors this. */
export const EnvSchema = Type.Object({
  NODE_ENV: Type.String({ default: 'development' }),
  DATABASE_URL: Type.Optional(Type.String({ pattern: '^postgres(ql)?://' })),
  DATABASE_DIRECT_URL: Type.Optional(Type.String({ pattern: '^postgres(ql)?://' })),
  PORT: Type.Integer({ minimum: 0, maximum: 65535, default: 3000 }),
  HOST: Type.String({ minLength: 1, default: '127.0.0.1' }),
  API_KEYS: Type.Optional(Type.String()),
  API_KEY_SHA256: Type.Optional(Type.String()),
  LOG_LEVEL: Type.Union(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'].map(l => Type.Literal(l)),
    { default: 'info' }),
  PETS_SUNSET: Type.Optional(Type.String({ pattern: '^\\d{4}-\\d{2}-\\d{2}$' })),
  TRUST_PROXY: Type.Union([Type.Boolean(), Type.String({ minLength: 1 })], { default: false }),
  DATA_DIR: Type.String({ minLength: 1, default: './data' }),
  DB_POOL_MAX: Type.Integer({ minimum: 1, maximum: 1000, default: 10 }),
  DB_CONNECTION_TIMEOUT_MS: Type.Integer({ minimum: 1, maximum: 60000, default: 2000 }),
  DB_STATEMENT_TIMEOUT_MS: Type.Integer({ minimum: 1, maximum: 600000, default: 5000 }),
  BODY_LIMIT_BYTES: Type.Integer({ minimum: 1, maximum: 104857600, default: 65536 }),
  REQUEST_TIMEOUT_MS: Type.Integer({ minimum: 1, maximum: 600000, default: 30000 }),
  KEEP_ALIVE_TIMEOUT_MS: Type.Integer({ minimum: 1, maximum: 600000, default: 72000 }),
  HEADERS_TIMEOUT_MS: Type.Integer({ minimum: 1, maximum: 600000, default: 10000 }),
  MAX_HEADER_BYTES: Type.Integer({ minimum: 1024, maximum: 1048576, default: 16384 }),
  DB_POOL_MAX_WAITING: Type.Integer({ minimum: 0, maximum: 100000, default: 200 }),
  RATE_LIMIT_AUTH_FAILURES: Type.Integer({ minimum: 1, maximum: 1000000, default: 20 }),
  RATE_LIMIT_WINDOW_MS: Type.Integer({ minimum: 1000, maximum: 86400000, default: 60000 }),
  RATE_LIMIT_PER_KEY_PER_MINUTE: Type.Integer({ minimum: 0, maximum: 100000000, default: 0 }),
  REDIS_URL: Type.Optional(Type.String()),
  REDIS_TIMEOUT_MS: Type.Integer({ minimum: 1, maximum: 10000, default: 100 }),
  SHUTDOWN_DRAIN_MS: Type.Optional(Type.Integer({ minimum: 0, maximum: 600000 })),
  SHUTDOWN_TIMEOUT_MS: Type.Integer({ minimum: 1, maximum: 600000, default: 10000 }),
  METRICS_PORT: Type.Integer({ minimum: 0, maximum: 65535, default: 9464 }),
  METRICS_HOST: Type.String({ minLength: 1, default: '127.0.0.1' }),
  CORS_ORIGINS: Type.Optional(Type.String())
})

type Env = Static<typeof EnvSchema>

/** Read once at start, and never changed after (the object is frozen). */
export type Config = ReturnType<typeof loadConfig>

export class ConfigError extends StartupError { override name = 'ConfigError' }

/** crypto.hash: no Hash object for a digest auth.ts makes per request. */
export const sha256 = (key: string): Buffer => hash('sha256', key, 'buffer') as unknown as Buffer

// .env.example's placeholders start so: a key (or the digest of one) that still does was never replaced.
const PLACEHOLDER_DIGESTS = new Set(['change-me', 'change-me-api-key'].map(key => sha256(key).toString('hex')))
const REPLACE_HINT = 'replace it with a real key (for example the output of: openssl rand -hex 32)'

/** A comma-separated list where every entry must be non-blank ("a,,b" is a mistake, not two keys), each digested. */
function keyList (name: string, value: string | undefined, digest: (entry: string, n: number) => Buffer): Buffer[] {
  const items = value?.split(',').map(item => item.trim()) ?? []
  if (items.includes('')) throw new ConfigError(`${name} has an empty or blank key; separate keys with single commas`)
  return items.map((item, i) => digest(item, i + 1))
}

function apiKeyDigests (env: Env): Buffer[] {
  const plain = keyList('API_KEYS', env.API_KEYS, (key, n) => {
    if (!key.toLowerCase().startsWith('change-me')) return sha256(key)
    throw new ConfigError(`API_KEYS entry ${n} is a placeholder (it starts with "change-me"); ${REPLACE_HINT}`)
  })
  const hashed = keyList('API_KEY_SHA256', env.API_KEY_SHA256, (hex, n) => {
    if (!/^[0-9a-fA-F]{64}$/.test(hex)) {
      throw new ConfigError('API_KEY_SHA256 entries must be 64 hexadecimal characters (a SHA-256 digest)')
    }
    if (!PLACEHOLDER_DIGESTS.has(hex.toLowerCase())) return Buffer.from(hex, 'hex')
    throw new ConfigError(`API_KEY_SHA256 entry ${n} is the digest of a placeholder key from the example ` +
      `configuration; ${REPLACE_HINT}, and use its digest`)
  })
  return [...plain, ...hashed]
}

function httpDate (name: string, isoDate: string | undefined): string | undefined {
  if (isoDate === undefined) return undefined
  const date = new Date(`${isoDate}T00:00:00Z`)
  if (Number.isNaN(date.getTime()) || date.toISOString().slice(0, 10) !== isoDate) {
    throw new ConfigError(`${name} must be a valid ISO date (YYYY-MM-DD), got "${isoDate}"`)
  }
  return date.toUTCString()
}

// Else an address list or CIDR, as Fastify's trustProxy accepts.
const trustProxy = (value: boolean | string): boolean | string => value === 'true' || (value !== 'false' && value)

/** The URL is checked here but never quoted: it may hold a password. */
function redisUrl (value: string): string {
  const url = URL.canParse(value) ? new URL(value) : undefined
  if (url === undefined || !['redis:', 'rediss:'].includes(url.protocol) || url.hostname === '') {
    throw new ConfigError('REDIS_URL must be redis://[user:password@]host[:port][/db] (or rediss:// for TLS)')
  }
  return value
}

/** Each entry exactly as a browser sends Origin (lower case, no default port, no path): else it never matches. */
function corsOrigins (value: string | undefined): string[] {
  return (value?.split(',') ?? []).map(item => item.trim()).map((entry, i) => {
    const url = URL.canParse(entry) ? new URL(entry) : undefined
    const origin = url !== undefined && ['http:', 'https:'].includes(url.protocol) ? url.origin : undefined
    if (origin !== entry) {
      const hint = origin === undefined ? '' : ` (did you mean ${origin}?)`
      throw new ConfigError(`CORS_ORIGINS entry ${i + 1} ("${entry}") is not an origin${hint}; write each as ` +
        'http(s)://host[:port], comma-separated, without a path or trailing slash')
    }
    return origin
  })
}

/** Parses the environment once; a bad value throws a ConfigError naming the variable. */
export function loadConfig (source: NodeJS.ProcessEnv = process.env) {
  // Empty variables count as unset (deployment tools write them), except key lists: an empty key is an error.
  const data = Object.fromEntries(Object.entries(source).filter(([k, v]) => v !== '' || k.startsWith('API_KEY')))
  let env: Env
  try {
    env = envSchema<Env>({ schema: EnvSchema, data, env: false })
  } catch (err) {
    throw new ConfigError(`invalid configuration: ${(err as Error).message.replace(/env\//g, '')}`)
  }
  const production = env.NODE_ENV === 'production'
  const digests = apiKeyDigests(env)
  const missing = [env.DATABASE_URL === undefined && 'DATABASE_URL',
    digests.length === 0 && 'API_KEYS or API_KEY_SHA256'].filter(name => name !== false)
  if (production && missing.length > 0) {
    throw new ConfigError(`NODE_ENV=production requires ${missing.join(' and ')} to be set`)
  }
  if (env.DATABASE_DIRECT_URL !== undefined && env.DATABASE_URL === undefined) {
    throw new ConfigError('DATABASE_DIRECT_URL is set without DATABASE_URL; set DATABASE_URL too (the pool uses it)')
  }
  return Object.freeze({
    production,
    databaseUrl: env.DATABASE_URL,
    databaseDirectUrl: env.DATABASE_DIRECT_URL,
    port: env.PORT,
    host: env.HOST,
    apiKeyDigests: digests,
    logLevel: env.LOG_LEVEL,
    petsSunset: httpDate('PETS_SUNSET', env.PETS_SUNSET),
    trustProxy: trustProxy(env.TRUST_PROXY),
    dataDir: env.DATA_DIR,
    db: {
      poolMax: env.DB_POOL_MAX,
      connectionTimeoutMs: env.DB_CONNECTION_TIMEOUT_MS,
      statementTimeoutMs: env.DB_STATEMENT_TIMEOUT_MS,
      maxWaiting: env.DB_POOL_MAX_WAITING
    },
    bodyLimitBytes: env.BODY_LIMIT_BYTES,
    requestTimeoutMs: env.REQUEST_TIMEOUT_MS,
    keepAliveTimeoutMs: env.KEEP_ALIVE_TIMEOUT_MS,
    headersTimeoutMs: Math.min(env.HEADERS_TIMEOUT_MS, env.REQUEST_TIMEOUT_MS),
    maxHeaderBytes: env.MAX_HEADER_BYTES,
    rateLimit: {
      authFailures: env.RATE_LIMIT_AUTH_FAILURES,
      windowMs: env.RATE_LIMIT_WINDOW_MS,
      perKeyPerMinute: env.RATE_LIMIT_PER_KEY_PER_MINUTE
    },
    redis: env.REDIS_URL === undefined ? undefined : { url: redisUrl(env.REDIS_URL), timeoutMs: env.REDIS_TIMEOUT_MS },
    shutdown: { drainMs: env.SHUTDOWN_DRAIN_MS ?? (production ? 5000 : 0), timeoutMs: env.SHUTDOWN_TIMEOUT_MS },
    metrics: { port: env.METRICS_PORT, host: env.METRICS_HOST },
    corsOrigins: corsOrigins(env.CORS_ORIGINS)
  })
}
