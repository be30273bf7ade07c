import { createRequire } from 'node:module'
import type { FastifyBaseLogger } from 'fastify'
import { Redis } from 'ioredis'
import { Counter, Gauge, type Registry } from 'prom-client'

type Counted = { current: number, ttl: number }
type Callback = (err: Error | null, result?: Counted) => void
interface PluginStore {
  incr: (key: string, cb: Callback, timeWindow: number, max: number) => void
  read: (key: string, cb: Callback, timeWindow: number, max: number) => void
}
type StoreClass = new (continueExceeding: boolean, exponentialBackoff: boolean, ...rest: unknown[]) => PluginStore

// @fastify/rate-limit's own stores (it exports neither): LocalStore is the per-instance counter the
// service always used; RedisStore counts with one Lua script (INCR, PEXPIRE on the first hit), atomic across instances.
const require = createRequire(import.meta.url)
const LocalStore = require('@fastify/rate-limit/store/LocalStore.js') as StoreClass
const RedisStore = require('@fastify/rate-limit/store/RedisStore.js') as StoreClass

/** Every key the service writes to Redis starts with this. */
const REDIS_KEY_PREFIX = 'petstore:rate-limit:'
/** After Redis failed or was too slow, requests skip it this long before trying again (the reconnect clears it). */
const RETRY_AFTER_FAILURE_MS = 1000
/** At start, the longest wait for a first Redis connection; without one, limits count per instance until it comes. */
const STARTUP_WAIT_MS = 1000

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

/**
 * A store for @fastify/rate-limit that counts in Redis, so that every instance
 * of a deployment shares each limit exactly, and fails open to this instance's
 * own counters when Redis is unreachable, errs or does not answer within
 * timeoutMs. The per-instance counters are always kept, so a Redis outage
 * falls back to exactly the limits a deployment without Redis has (never to no
 * limit at all, which is what the plugin's skipOnError does). Recovery needs
 * no restart: the client reconnects by itself and the next request uses Redis.
 */
export class SharedRateLimitStore {
  // Both limits in one LRU: twice the 5000 entries each had in its own store before.
  private readonly local = new LocalStore(false, false, 10000)
  private readonly shared: PluginStore
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
    this.shared = new RedisStore(false, false, this.client, REDIS_KEY_PREFIX)
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

  incr (key: string, cb: Callback, timeWindow: number, max: number): void {
    this.local.incr(key, (_err, local) => {
      this.preferRedis('incr', key, timeWindow, max, cb, () => { cb(null, local) })
    }, timeWindow, max)
  }

  read (key: string, cb: Callback, timeWindow: number, max: number): void {
    this.preferRedis('read', key, timeWindow, max, cb, () => { this.local.read(key, cb, timeWindow, max) })
  }

  /** Both limiters share one store: their keys already name the limit. */
  child (): this {
    return this
  }

  /** Redis's answer when it gives one in time; otherwise this instance's. */
  private preferRedis (method: 'incr' | 'read', key: string, timeWindow: number, max: number, cb: Callback, locally: () => void): void {
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
    this.shared[method](key, (err, shared) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      if (err === null && shared !== undefined) {
        this.markAvailable()
        cb(null, shared)
        return
      }
      this.failed(err?.message ?? 'no answer')
      locally()
    }, timeWindow, max)
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
