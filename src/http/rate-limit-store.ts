import type { FastifyRateLimitOptions, FastifyRateLimitStore, FastifyRateLimitStoreCtor } from '@fastify/rate-limit'
import type { FastifyBaseLogger } from 'fastify'
import { Redis, type Result } from 'ioredis'
import { Counter, Gauge, type Registry } from 'prom-client'
import { LruMap } from 'toad-cache'

type Counted = { current: number, ttl: number }
type Callback = (err: Error | null, result?: Counted) => void

declare module 'ioredis' {
  interface RedisCommander<Context> {
    rateLimitIncr: (key: string, timeWindowMs: number) => Result<[number, number], Context>
    rateLimitRead: (key: string) => Result<[number, number], Context>
  }
}

// One atomic step, so parallel checks on several instances cannot both pass; a key without an expiry gets one
// (no address is refused forever).
const INCR_SCRIPT = `
local count = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {count, ttl}`

const READ_SCRIPT = `
local count = redis.call('GET', KEYS[1])
if not count then return {0, 0} end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then ttl = 0 end
return {tonumber(count), ttl}`

const REDIS_KEY_PREFIX = 'petstore:rate-limit:'
const RETRY_AFTER_FAILURE_MS = 1000 // after Redis failed or was slow, requests skip it this long (or till it is back)
const STARTUP_WAIT_MS = 1000 // a Redis that is down must not stop the start: limits count per instance until it comes
const LOCAL_KEYS_PER_LIMIT = 5000 // the plugin's in-memory store's default

export interface SharedStoreOptions {
  url: string
  timeoutMs: number // the longest a request waits for Redis before it is counted on this instance alone
  log: FastifyBaseLogger
  registry: Registry
}

/** Never the user name or password, for log lines. */
function redisAddress (url: string): string {
  const parsed = new URL(url)
  return `${parsed.hostname}:${parsed.port === '' ? '6379' : parsed.port}`
}

interface Window { count: number, openedAt: number }

/** Counted as the plugin's in-memory store does, so a Redis outage falls back to exactly its limits. */
class LocalCounters {
  private readonly windows = new LruMap<Window>(LOCAL_KEYS_PER_LIMIT)

  incr (key: string, timeWindow: number): Counted {
    const now = Date.now()
    let window = this.windows.get(key)
    if (window === undefined || window.openedAt + timeWindow <= now) window = { count: 0, openedAt: now }
    window.count++
    this.windows.set(key, window)
    return { current: window.count, ttl: window.openedAt + timeWindow - now }
  }

  read (key: string, timeWindow: number): Counted {
    const now = Date.now()
    const window = this.windows.get(key)
    if (window === undefined || window.openedAt + timeWindow <= now) return { current: 0, ttl: 0 }
    return { current: window.count, ttl: window.openedAt + timeWindow - now }
  }
}

/** Without Redis: the plugin's own store hands concurrent checks one shared count that goes on changing. */
export class LocalRateLimitStore implements FastifyRateLimitStore {
  private readonly local = new LocalCounters()
  incr (key: string, callback: Callback, timeWindow: number): void { callback(null, this.local.incr(key, timeWindow)) }
  read (key: string, callback: Callback, timeWindow: number): void { callback(null, this.local.read(key, timeWindow)) }
  child (): FastifyRateLimitStore { return new LocalRateLimitStore() }
}

/**
 * Counting in Redis, shared by every instance, falling back to this instance's own counters (always kept) when
 * Redis fails or is slower than timeoutMs: never to no limit at all, which is what the plugin's skipOnError does.
 */
export class SharedRateLimitStore {
  private readonly client: Redis
  private readonly address: string
  private readonly up: Gauge
  private readonly fallbacks: Counter
  private available = true
  private skipUntil = 0
  private closing = false
  private lastError: string | undefined

  constructor (private readonly options: SharedStoreOptions) {
    this.address = redisAddress(options.url)
    this.client = new Redis(options.url, {
      // No queue while disconnected: a command fails at once and the request is counted locally.
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      // The request's wait is bounded in preferRedis; this only clears commands a hung Redis never answers.
      commandTimeout: Math.max(10 * options.timeoutMs, 5000),
      connectTimeout: Math.max(1000, options.timeoutMs),
      // Reconnect forever, at most a second apart, so the service is back on Redis soon after Redis is.
      retryStrategy: (attempt: number) => Math.min(attempt * 100, 1000),
      // Checks from concurrent requests share one round trip.
      enableAutoPipelining: true,
      lazyConnect: true
    })
    this.client.defineCommand('rateLimitIncr', { numberOfKeys: 1, lua: INCR_SCRIPT })
    this.client.defineCommand('rateLimitRead', { numberOfKeys: 1, lua: READ_SCRIPT, readOnly: true })
    const registers = [options.registry]
    const upHelp = '1 while rate limits count in Redis (deployment-wide), 0 while they count per instance'
    this.up = new Gauge({ name: 'rate_limit_redis_up', help: upHelp, registers })
    const fallbacksHelp = 'Rate-limit checks counted on this instance alone because Redis failed or was too slow'
    this.fallbacks = new Counter({ name: 'rate_limit_redis_fallbacks_total', help: fallbacksHelp, registers })
    this.up.set(1)
    // Without a listener ioredis prints every failed reconnect to stderr; the transitions are logged below instead.
    this.client.on('error', (err: Error) => { this.lastError = err.message })
    this.client.on('ready', () => {
      this.skipUntil = 0
      this.lastError = undefined
    })
    this.client.on('close', () => {
      if (this.closing) return
      this.markUnavailable(this.lastError === undefined ? 'connection closed' : `connection closed: ${this.lastError}`)
    })
  }

  async connect (): Promise<void> {
    const ready = new Promise<true>(resolve => this.client.once('ready', () => { resolve(true) }))
    this.client.connect().catch(() => {}) // failures arrive as 'error' events and retries
    const late = new Promise<false>(resolve => setTimeout(resolve, STARTUP_WAIT_MS, false).unref())
    const connected = await Promise.race([ready, late])
    if (connected) {
      this.options.log.info({ redis: this.address }, 'rate limits count in Redis, across every instance')
    } else {
      this.markUnavailable(this.lastError ?? `no connection within ${STARTUP_WAIT_MS} ms`)
    }
  }

  async close (): Promise<void> {
    this.closing = true
    this.client.disconnect(false) // no QUIT round trip: Redis may be the thing that is hanging
  }

  /** The plugin's documented custom store: child() once per limit, each with counters of its own. */
  storeClass (): FastifyRateLimitStoreCtor {
    const shared = this
    return class RedisFirstStore implements FastifyRateLimitStore {
      private readonly local = new LocalCounters()

      constructor (private readonly options: FastifyRateLimitOptions) {}

      incr (key: string, callback: Callback, timeWindow: number): void {
        const local = this.local.incr(key, timeWindow)
        shared.preferRedis('incr', key, timeWindow, callback, () => { callback(null, local) })
      }

      read (key: string, callback: Callback, timeWindow: number): void {
        const locally = (): void => { callback(null, this.local.read(key, timeWindow)) }
        shared.preferRedis('read', key, timeWindow, callback, locally)
      }

      child (): FastifyRateLimitStore {
        return new RedisFirstStore(this.options)
      }
    }
  }

  private preferRedis (method: 'incr' | 'read', key: string, timeWindow: number, cb: Callback, locally: () => void):
  void {
    if (!this.redisUsable()) {
      this.fallbacks.inc()
      locally()
      return
    }
    let settled = false
    const timer = setTimeout(() => {
      // Judged after this turn's I/O (setImmediate runs after the poll phase): when our own event
      // loop was the slow one, an answer already in the socket still counts, and is not a timeout.
      setImmediate(() => {
        if (settled) return
        settled = true
        this.failed(`no answer within ${this.options.timeoutMs} ms`)
        locally()
      })
    }, this.options.timeoutMs)
    const answer = method === 'incr'
      ? this.client.rateLimitIncr(REDIS_KEY_PREFIX + key, timeWindow)
      : this.client.rateLimitRead(REDIS_KEY_PREFIX + key)
    answer.then(([current, ttl]) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      this.markAvailable()
      cb(null, { current, ttl })
    }, (err: unknown) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      this.failed(err instanceof Error ? err.message : 'no answer')
      locally()
    })
  }

  private redisUsable (): boolean {
    return this.client.status === 'ready' && Date.now() >= this.skipUntil
  }

  private failed (reason: string): void {
    this.fallbacks.inc()
    this.skipUntil = Date.now() + RETRY_AFTER_FAILURE_MS
    this.markUnavailable(reason)
  }

  private markUnavailable (reason: string): void {
    if (!this.available) return
    this.available = false
    this.up.set(0)
    this.options.log.warn({ redis: this.address, reason },
      'Redis is unreachable or too slow: rate limits count per instance until it answers again')
  }

  private markAvailable (): void {
    if (this.available) return
    this.available = true
    this.up.set(1)
    this.options.log.info({ redis: this.address }, 'Redis answers again: rate limits count across every instance')
  }
}
