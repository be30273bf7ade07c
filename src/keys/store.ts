import { randomInt } from 'node:crypto'
import { crc32 } from 'node:zlib'
import type { Database } from '../db/database.js'
import type { ChangeFeed, Log } from '../machinery/change-feed.js'

export type Scope = 'read' | 'write'

/** A key that authenticated a request: managed (id from the table) or static (static-N, from the configuration). */
export interface AuthenticatedKey {
  id: string
  scope: Scope
  digest: Buffer
  /** Epoch ms; Infinity when it never expires. */
  expiresAt: number
  ratePerMinute: number | undefined
}

const KEY_PREFIX = 'petstore_'
const BODY_LENGTH = 30
const CHECKSUM_LENGTH = 6
const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'
/** What secret scanners look for (docs/deployment.md); the checksum is checked by wellFormedKey. */
const KEY_PATTERN = /^petstore_[0-9A-Za-z]{36}$/
const CHANNEL = 'api_keys_changed'
const POLL_MS = 250
const LAST_USED_FLUSH_MS = 30_000

function checksum (body: string): string {
  let out = ''
  for (let i = 0, n = crc32(body); i < CHECKSUM_LENGTH; i++, n = Math.floor(n / 62)) out = (BASE62[n % 62] ?? '') + out
  return out
}

/** petstore_ + 30 random base62 characters (178 bits) + their CRC32 in 6 base62 characters, as GitHub's tokens. */
export function generateKey (): string {
  const body = Array.from({ length: BODY_LENGTH }, () => BASE62[randomInt(62)]).join('')
  return KEY_PREFIX + body + checksum(body)
}

/** A key of this format whose checksum holds: a typo is refused without a look-up. */
export function wellFormedKey (key: string): boolean {
  const body = key.slice(KEY_PREFIX.length, -CHECKSUM_LENGTH)
  return KEY_PATTERN.test(key) && checksum(body) === key.slice(-CHECKSUM_LENGTH)
}

/** Shown by `keys list`: not enough of the key to guess it. */
export const keyPrefix = (key: string): string => key.slice(0, KEY_PREFIX.length + 4)

interface KeyRow { id: bigint, scope: Scope, digest: Buffer, rate: number | null, expires: number | null }

/**
 * Active managed keys in memory: read at start, on each change the feed announces, and every POLL_MS while it cannot
 * vouch that it hears (a change holds everywhere within a second). A failed read keeps the keys; expiry is per request.
 */
export class ApiKeyStore {
  private keys = new Map<string, AuthenticatedKey>()
  private readonly used = new Set<string>()
  private loading: Promise<void> | undefined
  private again = false
  private failing = false
  private timers: NodeJS.Timeout[] = []

  constructor (private readonly db: Database, private readonly feed: ChangeFeed, private readonly log: Log) {
    feed.subscribe(CHANNEL, { notified: this.poke, invalidate: this.poke })
  }

  find (digest: Buffer): AuthenticatedKey | undefined {
    const key = this.keys.get(digest.toString('base64'))
    if (key === undefined || key.expiresAt <= Date.now()) return undefined
    this.used.add(key.id)
    return key
  }

  async start (): Promise<void> {
    const poll = (): void => { if ((!this.feed.listening || this.failing) && this.loading === undefined) this.poke() }
    const flush = (): void => { this.flushUse().catch(() => {}) }
    this.timers = [setInterval(poll, POLL_MS).unref(), setInterval(flush, LAST_USED_FLUSH_MS).unref()]
    await this.reload()
  }

  async stop (): Promise<void> {
    for (const timer of this.timers) clearInterval(timer)
    await this.flushUse()
  }

  private readonly poke = (): void => { this.reload().catch(() => {}) }

  /** One read at a time; a change announced during a read makes another. */
  async reload (): Promise<void> {
    if (this.loading !== undefined) this.again = true
    this.loading ??= (async () => {
      do {
        this.again = false
        await this.read()
      } while (this.again && !this.failing)
    })().finally(() => { this.loading = undefined })
    await this.loading
  }

  private async read (): Promise<void> {
    try {
      const { rows } = await this.db.query<KeyRow>(`
        SELECT id, scope, digest, rate_limit_per_minute AS rate,
          extract(epoch FROM expires_at)::float8 * 1000 AS expires
        FROM api_keys WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())`, [], { bounded: false })
      this.keys = new Map(rows.map(({ id, scope, digest, expires, rate }) => [digest.toString('base64'),
        { id: String(id), scope, digest, expiresAt: expires ?? Infinity, ratePerMinute: rate ?? undefined }]))
      if (this.failing) this.log.info({ keys: rows.length }, 'API keys read from the database again')
      this.failing = false
    } catch (err) {
      if (!this.failing) this.log.warn({ err }, 'API keys could not be read; the keys known before keep working')
      this.failing = true
    }
  }

  /** last_used_at for every key used since the last flush, in one UPDATE (it notifies no instance). */
  private async flushUse (): Promise<void> {
    if (this.used.size === 0) return
    const ids = [...this.used]
    this.used.clear()
    await this.db.query('UPDATE api_keys SET last_used_at = now() WHERE id = ANY($1::bigint[])', [ids])
      .catch(() => { for (const id of ids) this.used.add(id) })
  }
}
