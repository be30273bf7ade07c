import { randomBytes } from 'node:crypto'
import pg from 'pg'
import type { Database } from '../db/database.js'

/** Distinctive, so operators (and tests) can find the listening connection in pg_stat_activity. */
export const LISTENER_APPLICATION_NAME = 'petstore-listener'
/** The channel the feed's own probes travel on (one for every channel it listens to: they share its connection). */
export const PROBE_CHANNEL = 'petstore_feed_probe'
/** Payloads of the feeds' own probe notifications (see ChangeFeed): never taken for a change, by any instance. */
export const PROBE_PREFIX = 'petstore-feed-probe/'

interface Log { warn: (obj: object, msg: string) => void, info: (obj: object, msg: string) => void }

export interface ChangeFeedOptions {
  /** Where to LISTEN: a connection that keeps its session (DATABASE_DIRECT_URL behind a transaction pooler). */
  connectionString: string
  /** Which setting `connectionString` came from, for the logs and metrics. */
  connectionName?: string
  /**
   * Sends a notification the way this instance's writes reach PostgreSQL (the
   * pool): the feed proves it hears by sending itself a probe this way.
   */
  notify: (channel: string, payload: string) => Promise<void>
  log: Log
  minBackoffMs?: number
  maxBackoffMs?: number
  /** How often the feed proves again that it hears (a probe through `notify`). */
  probeIntervalMs?: number
  /** How long a probe's echo may take once it is sent; a probe not heard by then means the feed is deaf. */
  probeTimeoutMs?: number
  /**
   * How long sending a probe may take (through a busy pool it first waits for a connection: that is
   * not deafness); a probe not sent by then drops the feed. Default 30 s.
   */
  probeSendTimeoutMs?: number
  /**
   * After DEAF_CONNECTIONS_BEFORE_PAUSE new connections in a row heard nothing (a
   * transaction pooler: every LISTEN stays behind on one of its server connections),
   * the feed tries again only this often.
   */
  deafRetryMs?: number
  connectionTimeoutMs?: number
  /** Checks the new connection before it LISTENs (db/servers.ts: not a standby, the server the pool writes to); a rejection drops it. */
  onConnect?: (client: pg.Client) => Promise<void>
}

/** New connections in a row whose first probe went unheard before the feed tries only every deafRetryMs. */
export const DEAF_CONNECTIONS_BEFORE_PAUSE = 3

/**
 * The pool as the feed's `notify`: the probe travels the way the service's writes do, without
 * taking a request's place in the pool's bounded wait queue (db/database.ts).
 */
export function notifyThrough (db: Database): ChangeFeedOptions['notify'] {
  return async (channel, payload) => { await db.query('SELECT pg_notify($1, $2)', [channel, payload], { bounded: false }) }
}

/** One channel's subscriber: handed every payload announced on it, and told whenever the feed starts or stops hearing. */
export interface Subscriber {
  /** A notification on the channel, with its payload. */
  notified: (payload: string) => void
  /** The feed starts or stops hearing: what it heard, or missed, is not known. */
  invalidate: () => void
}

const CHANNEL_NAME = /^[a-z_][a-z0-9_]{0,62}$/

/**
 * One dedicated connection (not from the pool) that LISTENs on the change
 * channels of every subscriber (each table's triggers notify its own channel),
 * and proves that it hears them: a LISTEN that succeeded proves nothing behind
 * a transaction pooler, which runs it on some server
 * connection and then hands that connection to other clients (the notifications
 * are dropped), while every query on the listening connection still succeeds.
 *
 * So after LISTEN, and every `probeIntervalMs`, the feed sends a probe
 * notification with a unique payload through `notify` (the pool) and waits for
 * its echo on the listening connection. `listening` is true only while the last
 * probe was heard within `probeTimeoutMs`; when a probe is not heard the feed
 * reconnects with exponential backoff, and when the connection drops too.
 */
export class ChangeFeed {
  listening = false
  /** How many times the connection was lost, never made, or found deaf since start. */
  drops = 0
  /** Probes sent whose echo did not arrive in time. */
  probesMissed = 0
  /** How long the last heard probe took from sending to its echo, in milliseconds. */
  lastEchoMs: number | undefined
  readonly connectionName: string
  private readonly subscribers = new Map<string, Subscriber>()
  private started = false
  private readonly id = randomBytes(6).toString('hex')
  private probes = 0
  private awaitedProbe: { payload: string, heard: () => void } | undefined
  /** Set once a deaf feed has been reported; cleared when it hears again, so that a feed that stays deaf warns once. */
  private reportedDeaf = false
  /** New connections in a row that heard none of their probes. */
  private deafConnections = 0
  private client: pg.Client | undefined
  /** Ends the current connection and schedules the next (set while one is open). */
  private dropCurrent: ((err?: unknown, reason?: string) => void) | undefined
  private closed = false
  private attempt = 0
  private retryTimer: NodeJS.Timeout | undefined
  private probeTimer: NodeJS.Timeout | undefined
  private readonly minBackoffMs: number
  private readonly maxBackoffMs: number
  private readonly probeIntervalMs: number
  private readonly probeTimeoutMs: number
  private readonly probeSendTimeoutMs: number
  private readonly deafRetryMs: number
  private readonly connectionTimeoutMs: number

  constructor (private readonly options: ChangeFeedOptions) {
    this.connectionName = options.connectionName ?? 'DATABASE_URL'
    this.minBackoffMs = options.minBackoffMs ?? 250
    this.maxBackoffMs = options.maxBackoffMs ?? 5000
    this.probeIntervalMs = options.probeIntervalMs ?? 5000
    this.connectionTimeoutMs = options.connectionTimeoutMs ?? 2000
    this.probeTimeoutMs = options.probeTimeoutMs ?? this.connectionTimeoutMs
    this.probeSendTimeoutMs = options.probeSendTimeoutMs ?? 30_000
    this.deafRetryMs = options.deafRetryMs ?? 10 * 60 * 1000
  }

  /** Listens on `channel` too (before start: the channels are LISTENed on each new connection). */
  subscribe (channel: string, subscriber: Subscriber): void {
    if (this.started) throw new Error('subscribe to the change feed before it starts')
    if (!CHANNEL_NAME.test(channel) || channel === PROBE_CHANNEL) throw new Error(`not a channel name for the change feed: ${channel}`)
    if (this.subscribers.has(channel)) throw new Error(`the change feed already has a subscriber on ${channel}`)
    this.subscribers.set(channel, subscriber)
  }

  start (): void {
    this.started = true
    this.connect().catch((err: unknown) => { this.options.log.warn({ err }, 'change feed failed to start') })
  }

  /** Every subscriber's cache must be dropped: the feed starts or stops hearing, so what it heard (or missed) is not known. */
  private changedEverywhere (): void {
    for (const subscriber of this.subscribers.values()) subscriber.invalidate()
  }

  /** Reconnects when the listening connection is one `stale` names (db/servers.ts: the database address moved). */
  reconnectIf (stale: (client: pg.Client) => boolean): void {
    if (this.client !== undefined && stale(this.client)) this.dropCurrent?.(new Error('the database address leads to another server'), 'change feed reconnects to where the database address leads now')
  }

  async close (): Promise<void> {
    this.closed = true
    clearTimeout(this.retryTimer)
    clearTimeout(this.probeTimer)
    this.listening = false
    const client = this.client
    this.client = undefined
    await client?.end().catch(() => {})
  }

  private async connect (): Promise<void> {
    if (this.closed) return
    const client = new pg.Client({
      connectionString: this.options.connectionString,
      application_name: LISTENER_APPLICATION_NAME,
      connectionTimeoutMillis: this.connectionTimeoutMs,
      query_timeout: this.connectionTimeoutMs,
      keepAlive: true
    })
    this.client = client
    let dropped = false
    const drop = (err?: unknown, reason = 'change feed disconnected; serving lists from the database'): void => {
      if (dropped) return
      dropped = true
      const wasListening = this.listening
      this.listening = false
      clearTimeout(this.probeTimer)
      if (this.client === client) this.client = undefined
      client.end().catch(() => {})
      if (this.closed) return
      this.drops++
      this.changedEverywhere()
      const paused = this.deafConnections >= DEAF_CONNECTIONS_BEFORE_PAUSE
      const delay = paused ? this.deafRetryMs : Math.min(this.maxBackoffMs, this.minBackoffMs * 2 ** this.attempt) * (0.75 + Math.random() * 0.5)
      this.attempt++
      if (err !== undefined) this.options.log.warn({ err, retryInMs: Math.round(delay), wasListening, connection: this.connectionName }, reason)
      if (paused && this.deafConnections === DEAF_CONNECTIONS_BEFORE_PAUSE) {
        this.options.log.warn({ retryInMs: delay, connection: this.connectionName }, `change feed heard nothing on ${DEAF_CONNECTIONS_BEFORE_PAUSE} connections in a row; it tries again less often (each LISTEN through a transaction pooler stays behind on one of its server connections)`)
      }
      this.retryTimer = setTimeout(() => { this.start() }, delay)
      this.retryTimer.unref()
    }
    this.dropCurrent = drop
    client.on('error', drop)
    client.on('end', () => { drop(new Error('listening connection ended')) })
    client.on('notification', (message) => {
      const payload = message.payload ?? ''
      const kind = notificationKind(message.channel, payload, { awaitedProbe: this.awaitedProbe?.payload, subscribed: channel => this.subscribers.has(channel) })
      if (kind === 'awaited-probe') this.awaitedProbe?.heard()
      else if (kind === 'change') this.subscribers.get(message.channel)?.notified(payload)
    })
    try {
      await client.connect()
      await this.options.onConnect?.(client)
      // Names checked by subscribe(): plain lower-case identifiers.
      await client.query([PROBE_CHANNEL, ...this.subscribers.keys()].map(channel => `LISTEN ${channel}`).join('; '))
    } catch (err) {
      drop(err)
      return
    }
    if (dropped || this.closed) {
      if (this.closed) await client.end().catch(() => {})
      return
    }
    await this.prove(client, drop, true)
  }

  /**
   * Sends a probe and waits for its echo; heard: listening (and the next probe scheduled), not heard: deaf, reconnect.
   * The echo's time limit starts once the probe is sent: a probe waiting for a busy pool's connection is not unheard.
   */
  private async prove (client: pg.Client, drop: (err?: unknown, reason?: string) => void, first = false): Promise<void> {
    const payload = `${PROBE_PREFIX}${this.id}/${++this.probes}`
    const sent = performance.now()
    let heard = false
    let onHeard = (): void => {}
    this.awaitedProbe = { payload, heard: () => { heard = true; onHeard() } }
    const sending = await settleWithin(this.options.notify(PROBE_CHANNEL, payload), this.probeSendTimeoutMs)
    if (sending.sent && !heard) {
      await new Promise<void>(resolve => {
        const timer = setTimeout(resolve, this.probeTimeoutMs)
        onHeard = () => { clearTimeout(timer); resolve() }
      })
    }
    this.awaitedProbe = undefined
    if (this.closed || this.client !== client) return
    if (!heard) {
      this.probesMissed++
      // One warning when the feed stops hearing, not one per attempt while it stays deaf.
      const report = !this.reportedDeaf
      this.reportedDeaf = true
      if (sending.sent) {
        if (first) this.deafConnections++
        drop(report ? new Error('probe notification not heard') : undefined,
          `change feed did not hear its own notification within ${this.probeTimeoutMs} ms; serving lists from the database` +
          (this.connectionName === 'DATABASE_URL' ? ' (behind a transaction pooler LISTEN hears nothing: set DATABASE_DIRECT_URL)' : ''))
      } else {
        drop(report ? sending.err : undefined, 'change feed could not send its probe notification; serving lists from the database')
      }
      return
    }
    this.lastEchoMs = performance.now() - sent
    if (!this.listening) {
      this.listening = true
      // Changes committed before we heard were never announced to us.
      this.changedEverywhere()
      const again = this.attempt > 0 || this.reportedDeaf
      this.options.log.info({ echoMs: Math.round(this.lastEchoMs), connection: this.connectionName, ...(again ? { attempts: this.attempt } : {}) },
        `change feed hears notifications${again ? ' again' : ''}; serving lists from the cache`)
    }
    this.attempt = 0
    this.reportedDeaf = false
    this.deafConnections = 0
    this.probeTimer = setTimeout(() => { this.prove(client, drop).catch(drop) }, this.probeIntervalMs)
    this.probeTimer.unref()
  }
}

/**
 * What a notification means to the feed: the echo of the probe it waits for; another probe (an older
 * one, another instance's, or one on a change channel), ignored; a change to a subscribed channel; or
 * nothing it listens for.
 */
export function notificationKind (channel: string, payload: string, state: { awaitedProbe: string | undefined, subscribed: (channel: string) => boolean }): 'awaited-probe' | 'other-probe' | 'change' | 'unsubscribed' {
  if (payload.startsWith(PROBE_PREFIX)) return channel === PROBE_CHANNEL && payload === state.awaitedProbe ? 'awaited-probe' : 'other-probe'
  if (!state.subscribed(channel)) return 'unsubscribed'
  return 'change'
}

/** Whether `sending` resolved within `ms`, and why not. */
async function settleWithin (sending: Promise<void>, ms: number): Promise<{ sent: true } | { sent: false, err: unknown }> {
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<{ sent: false, err: unknown }>(resolve => {
    timer = setTimeout(() => { resolve({ sent: false, err: new Error(`not sent within ${ms} ms`) }) }, ms)
  })
  try {
    return await Promise.race([sending.then(() => ({ sent: true as const }), (err: unknown) => ({ sent: false as const, err })), late])
  } finally {
    clearTimeout(timer)
  }
}
