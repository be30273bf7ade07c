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

/**
 * One atomic step on the Redis server, so parallel checks on several instances
 * cannot both pass: a fixed window that opens at a key's first hit, as in memory.
 * A key without an expiry (never written by this script) gets one too, so no
 * address can be refused forever. Answers the count and the window's time left.
 */
const INCR_SCRIPT = `
local count = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {count, ttl}`

/** The same answer without counting: {0, 0} when no window is open. */
const READ_SCRIPT = `
local count = redis.call('GET', KEYS[1])
if not count then return {0, 0} end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then ttl = 0 end
return {tonumber(count), ttl}`

/** Every key the service writes to Redis starts with this. */
const REDIS_KEY_PREFIX = 'petstore:rate-limit:'
/** After Redis failed or was too slow, requests skip it this long before trying again (the reconnect clears it). */
const RETRY_AFTER_FAILURE_MS = 1000
/** At start, the longest wait for a first Redis connection; without one, limits count per instance until it comes. */
const STARTUP_WAIT_MS = 1000
/** Addresses or keys one limit remembers on this instance: the plugin's in-memory store's default. */
const LOCAL_KEYS_PER_LIMIT = 5000

export interface SharedStoreOptions {
  url: string
  /** The longest a request waits for Redis before it is counted on this instance alone. */
  timeoutMs: number
  log: FastifyBaseLogger
  registry: Registry
}

/** host:port of a Redis URL, for log lines: never the user name or password. */
function redisAddress (url: string): string {
  const parsed = new URL(url)
  return `${parsed.hostname}:${parsed.port === '' ? '6379' : parsed.port}`
}

interface Window { count: number, openedAt: number }

/**
 * One limit's counters on this instance, counted as the plugin's in-memory
 * store counts (a fixed window from a key's first hit, the least recently
 * seen key forgotten first), so a Redis outage falls back to exactly the
 * limits of a deployment without Redis.
 */
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

/**
 * Rate-limit counting in Redis, so that every instance of a deployment shares
 * each limit exactly, failing open to this instance's own counters when Redis
 * is unreachable, errs or does not answer within timeoutMs. The per-instance
 * counters are always kept, so an outage falls back to the per-instance limits
 * (never to no limit at all, which is what the plugin's skipOnError does).
 * Recovery needs no restart: the client reconnects by itself and the next
 * request uses Redis. `storeClass()` is what the plugin's `store` option takes.
 */
export class SharedRateLimitStore {
  private readonly client: Redis
  private readonly address: string
  private readonly timeoutMs: number
  private readonly log: FastifyBaseLogger
  private readonly up: Gauge
  private readonly fallbacks: Counter
  /** False from the first failure until Redis answers again; a warning marks each change. */
  private available = true
  private skipUntil = 0
  private closing = false
  /** The client's last error since it was last ready: the reason a warning gives. */
  private lastError: string | undefined

  constructor (options: SharedStoreOptions) {
    this.address = redisAddress(options.url)
    this.timeoutMs = options.timeoutMs
    this.log = options.log
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
    this.up = new Gauge({ name: 'rate_limit_redis_up', help: '1 while rate limits count in Redis (deployment-wide), 0 while they count per instance', registers: [options.registry] })
    this.fallbacks = new Counter({ name: 'rate_limit_redis_fallbacks_total', help: 'Rate-limit checks counted on this instance alone because Redis failed or was too slow', registers: [options.registry] })
    this.up.set(1)
    // Without a listener ioredis prints every failed reconnect to stderr; the transitions are logged below instead.
    this.client.on('error', (err: Error) => { this.lastError = err.message })
    this.client.on('ready', () => {
      this.skipUntil = 0
      this.lastError = undefined
    })
    this.client.on('close', () => {
      if (!this.closing) this.markUnavailable(this.lastError === undefined ? 'connection closed' : `connection closed: ${this.lastError}`)
    })
  }

  /** Connects, waiting at most STARTUP_WAIT_MS: a Redis that is down must not stop the service from starting. */
  async connect (): Promise<void> {
    const ready = new Promise<true>(resolve => this.client.once('ready', () => { resolve(true) }))
    this.client.connect().catch(() => {}) // failures arrive as 'error' events and retries
    const connected = await Promise.race([ready, new Promise<false>(resolve => setTimeout(resolve, STARTUP_WAIT_MS, false).unref())])
    if (connected) {
      this.log.info({ redis: this.address }, 'rate limits count in Redis, across every instance')
    } else {
      this.markUnavailable(this.lastError ?? `no connection within ${STARTUP_WAIT_MS} ms`)
    }
  }

  async close (): Promise<void> {
    this.closing = true
    this.client.disconnect(false) // no QUIT round trip: Redis may be the thing that is hanging
  }

  /**
   * The plugin's documented custom store: it constructs the class with its
   * options, and calls child() once per limit (createRateLimit). Each limit
   * keeps its own counters on this instance; all share this connection. The
   * plugin's `{ increment: false }` calls read(). Keys already name their
   * limit, so a Redis key is the prefix and the key.
   */
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
        shared.preferRedis('read', key, timeWindow, callback, () => { callback(null, this.local.read(key, timeWindow)) })
      }

      child (): FastifyRateLimitStore {
        return new RedisFirstStore(this.options)
      }
    }
  }

  /** Redis's answer when it gives one in time; otherwise this instance's. */
  private preferRedis (method: 'incr' | 'read', key: string, timeWindow: number, cb: Callback, locally: () => void): void {
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
        this.failed(`no answer within ${this.timeoutMs} ms`)
        locally()
      })
    }, this.timeoutMs)
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
    this.log.warn({ redis: this.address, reason }, 'Redis is unreachable or too slow: rate limits count per instance until it answers again')
  }

  private markAvailable (): void {
    if (this.available) return
    this.available = true
    this.up.set(1)
    this.log.info({ redis: this.address }, 'Redis answers again: rate limits count across every instance')
  }
}
