import type { FastifyRateLimitStore, FastifyRateLimitStoreCtor } from '@fastify/rate-limit'
import type { FastifyInstance } from 'fastify'
import { Redis, type Result } from 'ioredis'
import { Counter, Gauge } from 'prom-client'
import { LruMap } from 'toad-cache'

type Counted = { current: number, ttl: number }
type Callback = (err: Error | null, result?: Counted) => void

declare module 'ioredis' {
  interface RedisCommander<Context> {
    rateLimitCount: (key: string, timeWindowMs: number, command: 'INCR' | 'GET') => Result<[number, number], Context>
  }
}

// One atomic step, so parallel checks on several instances cannot both pass; an incremented key without an expiry
// gets one (no address is refused forever).
const COUNT_SCRIPT = `
local count = redis.call(ARGV[2], KEYS[1])
if not count then return {0, 0} end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 and ARGV[2] == 'INCR' then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {tonumber(count), math.max(ttl, 0)}`

const RETRY_AFTER_FAILURE_MS = 1000 // after Redis failed or was slow, requests skip it this long (or till it is back)
const STARTUP_WAIT_MS = 1000 // a Redis that is down must not stop the start: limits count per instance until it comes
/** Keys counted per limit: the plugin's own in-memory store keeps as many. */
const LOCAL_KEYS = 5000
/** A command a hung Redis never answers is cleared after this many request timeouts, and at least this long. */
const COMMAND_TIMEOUTS = 10
const MIN_COMMAND_TIMEOUT_MS = 5000
const MIN_CONNECT_TIMEOUT_MS = 1000
/** Reconnects back off by this much per attempt, to at most RECONNECT_MAX_MS apart. */
const RECONNECT_STEP_MS = 100
const RECONNECT_MAX_MS = 1000

/**
 * Counted as the plugin's in-memory store does (5000 keys per limit), so a Redis outage falls back to exactly its
 * limits; but each answer is a copy: the plugin's store hands concurrent checks one shared, still changing count.
 */
export class LocalRateLimitStore implements FastifyRateLimitStore {
  private readonly windows = new LruMap<{ count: number, openedAt: number }>(LOCAL_KEYS)

  incr (key: string, cb: Callback, timeWindow: number): void {
    cb(null, this.count(key, timeWindow, true))
  }

  read (key: string, cb: Callback, timeWindow: number): void {
    cb(null, this.count(key, timeWindow, false))
  }

  child (): FastifyRateLimitStore {
    return new LocalRateLimitStore()
  }

  protected count (key: string, timeWindow: number, increment: boolean): Counted {
    const now = Date.now()
    let window = this.windows.get(key)
    if (window === undefined || window.openedAt + timeWindow <= now) window = { count: 0, openedAt: now }
    if (increment) {
      window.count++
      this.windows.set(key, window)
    }
    if (window.count === 0) return { current: 0, ttl: 0 }
    return { current: window.count, ttl: window.openedAt + timeWindow - now }
  }
}

/**
 * Counting in Redis, shared by every instance, falling back to this instance's own counters (always kept) when
 * Redis fails or is slower than timeoutMs: never to no limit at all, which is what the plugin's skipOnError does.
 */
export async function redisFirstStore (app: FastifyInstance, { url, timeoutMs }: { url: string, timeoutMs: number }):
Promise<FastifyRateLimitStoreCtor> {
  const { hostname, port } = new URL(url)
  const redis = `${hostname}:${port === '' ? '6379' : port}` // never the user name or password, for log lines
  const client = new Redis(url, {
    // No queue while disconnected: a command fails at once and the request is counted locally.
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    // The request's wait is bounded in preferRedis; this only clears commands a hung Redis never answers.
    commandTimeout: Math.max(COMMAND_TIMEOUTS * timeoutMs, MIN_COMMAND_TIMEOUT_MS),
    connectTimeout: Math.max(MIN_CONNECT_TIMEOUT_MS, timeoutMs),
    // Reconnect forever, at most a second apart, so the service is back on Redis soon after Redis is.
    retryStrategy: (attempt: number) => Math.min(attempt * RECONNECT_STEP_MS, RECONNECT_MAX_MS),
    enableAutoPipelining: true,
    lazyConnect: true
  })
  client.defineCommand('rateLimitCount', { numberOfKeys: 1, lua: COUNT_SCRIPT })
  const registers = [app.metrics]
  const upHelp = '1 while rate limits count in Redis (deployment-wide), 0 while they count per instance'
  const up = new Gauge({ name: 'rate_limit_redis_up', help: upHelp, registers })
  const fallbacksHelp = 'Rate-limit checks counted on this instance alone because Redis failed or was too slow'
  const fallbacks = new Counter({ name: 'rate_limit_redis_fallbacks_total', help: fallbacksHelp, registers })
  up.set(1)
  let available = true
  let skipUntil = 0
  let closing = false
  let lastError: string | undefined

  function setAvailable (now: boolean, reason?: string): void {
    if (available === now) return
    available = now
    up.set(now ? 1 : 0)
    if (now) {
      app.log.info({ redis }, 'Redis answers again: rate limits count across every instance')
    } else {
      app.log.warn({ redis, reason },
        'Redis is unreachable or too slow: rate limits count per instance until it answers again')
    }
  }

  // Without a listener ioredis prints every failed reconnect to stderr; the transitions are logged instead.
  client.on('error', (err: Error) => { lastError = err.message })
  client.on('ready', () => {
    skipUntil = 0
    lastError = undefined
  })
  client.on('close', () => {
    if (!closing) setAvailable(false, lastError === undefined ? 'connection closed' : `connection closed: ${lastError}`)
  })
  app.addHook('onClose', async () => {
    closing = true
    client.disconnect(false) // no QUIT round trip: Redis may be the thing that is hanging
  })

  const ready = new Promise<true>(resolve => client.once('ready', () => { resolve(true) }))
  client.connect().catch(() => {}) // failures arrive as 'error' events and retries
  const late = new Promise<false>(resolve => setTimeout(resolve, STARTUP_WAIT_MS, false).unref())
  if (await Promise.race([ready, late])) app.log.info({ redis }, 'rate limits count in Redis, across every instance')
  else setAvailable(false, lastError ?? `no connection within ${STARTUP_WAIT_MS} ms`)

  function preferRedis (key: string, windowMs: number, command: 'INCR' | 'GET', cb: Callback, local: () => Counted):
  void {
    if (client.status !== 'ready' || Date.now() < skipUntil) {
      fallbacks.inc()
      cb(null, local())
      return
    }
    let settled = false
    const fallBack = (reason: string): void => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      fallbacks.inc()
      skipUntil = Date.now() + RETRY_AFTER_FAILURE_MS
      setAvailable(false, reason)
      cb(null, local())
    }
    // Judged after this turn's I/O (setImmediate runs after the poll phase): when our own event
    // loop was the slow one, an answer already in the socket still counts, and is not a timeout.
    const timer = setTimeout(() => { setImmediate(fallBack, `no answer within ${timeoutMs} ms`) }, timeoutMs)
    client.rateLimitCount(`petstore:rate-limit:${key}`, windowMs, command).then(([current, ttl]) => {
      if (settled) return
      settled = true
      clearTimeout(timer)
      setAvailable(true)
      cb(null, { current, ttl })
    }, (err: unknown) => { fallBack(err instanceof Error ? err.message : 'no answer') })
  }

  // The plugin's documented custom store: child() once per limit, each with counters of its own.
  return class RedisFirstStore extends LocalRateLimitStore {
    override incr (key: string, cb: Callback, timeWindow: number): void {
      const counted = this.count(key, timeWindow, true)
      preferRedis(key, timeWindow, 'INCR', cb, () => counted)
    }

    override read (key: string, cb: Callback, timeWindow: number): void {
      preferRedis(key, timeWindow, 'GET', cb, () => this.count(key, timeWindow, false))
    }

    override child (): FastifyRateLimitStore { return new RedisFirstStore() }
  }
}
