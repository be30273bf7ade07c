import { randomBytes } from 'node:crypto'
import { setTimeout as delay } from 'node:timers/promises'
import pg from 'pg'
import { Counter, Gauge, type Registry } from 'prom-client'
import type { Database } from '../db/database.js'

export const LISTENER_APPLICATION_NAME = 'petstore-listener'
export const PROBE_CHANNEL = 'petstore_feed_probe'
/** Never taken for a change, by any instance. */
export const PROBE_PREFIX = 'petstore-feed-probe/'

export interface Log { warn: (obj: object, msg: string) => void, info: (obj: object, msg: string) => void }

const CONNECTION_TIMEOUT_MS = 2000
const DEAF_CONNECTIONS_BEFORE_PAUSE = 3

const DEFAULTS = {
  /** Which setting `connectionString` came from, for the logs and metrics. */
  connectionName: 'DATABASE_URL',
  minBackoffMs: 250,
  maxBackoffMs: 5000,
  probeIntervalMs: 5000,
  probeTimeoutMs: CONNECTION_TIMEOUT_MS,
  /** How long sending a probe may take: a busy pool's wait for a connection is not deafness. */
  probeSendTimeoutMs: 30_000,
  /** How often to try again once DEAF_CONNECTIONS_BEFORE_PAUSE new connections in a row heard nothing. */
  deafRetryMs: 10 * 60 * 1000
}

export type ChangeFeedOptions = Partial<typeof DEFAULTS> & {
  /** A connection that keeps its session (DATABASE_DIRECT_URL behind a transaction pooler). */
  connectionString: string
  /** Sends a notification the way this instance's writes travel (the pool): its probes go this way. */
  notify: (channel: string, payload: string) => Promise<void>
  log: Log
  /** Checks the new connection before it LISTENs (db/servers.ts); a rejection drops it. */
  onConnect?: (client: pg.Client) => Promise<void>
  /** Where the feed's own metrics (change_feed_*) go: one feed per process. */
  registry?: Registry
}

/** The pool as the feed's `notify`, without taking a request's place in its bounded queue. */
export const notifyThrough = (db: Database): ChangeFeedOptions['notify'] => async (channel, payload) => {
  await db.query('SELECT pg_notify($1, $2)', [channel, payload], { bounded: false })
}

export interface Subscriber {
  notified: (payload: string) => void
  /** The feed starts or stops hearing: what it heard, or missed, is not known. */
  invalidate: () => void
  /** The feed hears (again), after `invalidate`: what was dropped may be built again. */
  hearing?: () => void
}

const CHANNEL_NAME = /^[a-z_][a-z0-9_]{0,62}$/

/**
 * One connection LISTENing on every subscriber's channel, proving it hears: behind a transaction pooler a LISTEN
 * succeeds and hears nothing. So the feed sends itself a probe through the pool every probeIntervalMs; `listening`
 * holds while each echo comes within probeTimeoutMs. Unheard or disconnected, it reconnects with backoff.
 */
export class ChangeFeed {
  listening = false
  /** Once the first connection has heard its probe, or failed: until then nobody knows whether the feed hears. */
  settled = false
  readonly connectionName: string
  private readonly drops: Counter
  private readonly probesMissed: Counter
  private lastEchoMs: number | undefined
  private readonly options: typeof DEFAULTS & ChangeFeedOptions
  private readonly subscribers = new Map<string, Subscriber>()
  private started = false
  private awaitedProbe: { payload: string, heard: () => void } | undefined
  private reportedDeaf = false
  private deafConnections = 0
  private client: pg.Client | undefined
  private readonly dropped = new WeakSet<pg.Client>()
  private closed = false
  private attempt = 0
  private retryTimer: NodeJS.Timeout | undefined
  private probeTimer: NodeJS.Timeout | undefined

  constructor (options: ChangeFeedOptions) {
    this.options = { ...DEFAULTS, ...options }
    this.connectionName = this.options.connectionName
    const registers = options.registry === undefined ? [] : [options.registry]
    this.drops = new Counter({
      name: 'change_feed_drops_total',
      help: 'Times the change feed connection was lost, could not be made, or was found deaf',
      registers
    })
    this.probesMissed = new Counter({
      name: 'change_feed_probes_missed_total',
      help: 'Probe notifications the change feed sent through the pool and did not hear in time',
      registers
    })
    this.registerGauges(registers)
  }

  private registerGauges (registers: Registry[]): void {
    const feed = this
    /* eslint-disable no-new */
    new Gauge({
      name: 'change_feed_listening',
      help: '1 while the change feed hears notifications (its last probe was echoed) and cached lists and keys may ' +
        'be used; 0: lists are read from the database and keys polled',
      registers,
      collect () {
        this.set(feed.listening ? 1 : 0)
      }
    })
    new Gauge({
      name: 'change_feed_echo_seconds',
      help: 'Time from sending the change feed\'s last heard probe notification to its echo',
      registers,
      collect () {
        this.set(feed.lastEchoMs === undefined ? NaN : feed.lastEchoMs / 1000)
      }
    })
    new Gauge({
      name: 'change_feed_connection_info',
      help: 'The setting whose connection the change feed listens on (DATABASE_DIRECT_URL or DATABASE_URL)',
      labelNames: ['connection'],
      registers,
      collect () {
        this.labels(feed.connectionName).set(1)
      }
    })
    /* eslint-enable no-new */
  }

  subscribe (channel: string, subscriber: Subscriber): void {
    if (this.started) throw new Error('subscribe to the change feed before it starts')
    if (!CHANNEL_NAME.test(channel) || channel === PROBE_CHANNEL) {
      throw new Error(`not a channel name for the change feed: ${channel}`)
    }
    if (this.subscribers.has(channel)) throw new Error(`the change feed already has a subscriber on ${channel}`)
    this.subscribers.set(channel, subscriber)
  }

  start (): void {
    this.started = true
    this.connect().catch((err: unknown) => { this.options.log.warn({ err }, 'change feed failed to start') })
  }

  private changedEverywhere (): void {
    for (const subscriber of this.subscribers.values()) subscriber.invalidate()
  }

  /** Reconnects when the listening connection is one `stale` names (the database address moved). */
  reconnectIf (stale: (client: pg.Client) => boolean): void {
    if (this.client === undefined || !stale(this.client)) return
    this.drop(this.client, new Error('the database address leads to another server'),
      'change feed reconnects to where the database address leads now')
  }

  async close (): Promise<void> {
    this.closed = true
    clearTimeout(this.retryTimer)
    clearTimeout(this.probeTimer)
    this.listening = false
    await this.client?.end().catch(() => {})
  }

  private async connect (): Promise<void> {
    if (this.closed) return
    const client = new pg.Client({
      connectionString: this.options.connectionString,
      application_name: LISTENER_APPLICATION_NAME,
      connectionTimeoutMillis: CONNECTION_TIMEOUT_MS,
      query_timeout: CONNECTION_TIMEOUT_MS,
      keepAlive: true
    })
    this.client = client
    const drop = (err?: unknown, reason?: string): void => { this.drop(client, err, reason) }
    client.on('error', drop)
    client.on('end', () => { drop(new Error('listening connection ended')) })
    client.on('notification', ({ channel, payload = '' }) => {
      const kind = notificationKind(channel, payload,
        { awaitedProbe: this.awaitedProbe?.payload, subscribed: channel => this.subscribers.has(channel) })
      if (kind === 'awaited-probe') this.awaitedProbe?.heard()
      else if (kind === 'change') this.subscribers.get(channel)?.notified(payload)
    })
    try {
      await client.connect()
      await this.options.onConnect?.(client)
      // subscribe() checked the names: plain lower-case identifiers.
      await client.query([PROBE_CHANNEL, ...this.subscribers.keys()].map(channel => `LISTEN ${channel}`).join('; '))
    } catch (err) {
      drop(err)
      return
    }
    if (this.closed) await client.end().catch(() => {})
    else if (!this.dropped.has(client)) await this.prove(client, true)
  }

  /** Ends a listening connection once (lost, deaf or moved): lists are read from the database, and it tries again. */
  private drop (client: pg.Client, err?: unknown, reason = 'change feed disconnected; serving lists from the database'):
  void {
    if (this.dropped.has(client)) return
    this.dropped.add(client)
    const wasListening = this.listening
    this.listening = false
    this.settled = true
    clearTimeout(this.probeTimer)
    if (this.client === client) this.client = undefined
    client.end().catch(() => {})
    if (this.closed) return
    this.drops.inc()
    this.changedEverywhere()
    const { log, minBackoffMs, maxBackoffMs, deafRetryMs } = this.options
    const paused = this.deafConnections >= DEAF_CONNECTIONS_BEFORE_PAUSE
    const jitter = 0.75 + Math.random() * 0.5
    const delay = paused ? deafRetryMs : Math.min(maxBackoffMs, minBackoffMs * 2 ** this.attempt) * jitter
    this.attempt++
    const connection = this.connectionName
    if (err !== undefined) log.warn({ err, retryInMs: Math.round(delay), wasListening, connection }, reason)
    if (paused && this.deafConnections === DEAF_CONNECTIONS_BEFORE_PAUSE) {
      log.warn({ retryInMs: delay, connection }, `change feed heard nothing on ${DEAF_CONNECTIONS_BEFORE_PAUSE} ` +
        'connections in a row; it tries again less often (each LISTEN through a transaction pooler stays behind on ' +
        'one of its server connections)')
    }
    this.retryTimer = setTimeout(() => { this.start() }, delay).unref()
  }

  /** A probe and its echo; the echo's time limit starts once it is sent (a busy pool's wait is not deafness). */
  private async prove (client: pg.Client, first = false): Promise<void> {
    const { notify, probeSendTimeoutMs, probeTimeoutMs } = this.options
    const payload = PROBE_PREFIX + randomBytes(8).toString('hex')
    const sent = performance.now()
    let heard = false
    const echo = new Promise<void>(resolve => {
      const heardIt = (): void => {
        heard = true
        resolve()
      }
      this.awaitedProbe = { payload, heard: heardIt }
    })
    const sending = await sendWithin(notify(PROBE_CHANNEL, payload), probeSendTimeoutMs)
    if (sending.sent) await Promise.race([echo, delay(probeTimeoutMs, undefined, { ref: false })])
    this.awaitedProbe = undefined
    if (this.closed || this.client !== client) return
    if (!heard) {
      this.probesMissed.inc()
      if (sending.sent && first) this.deafConnections++
      const hint = this.connectionName === 'DATABASE_URL'
        ? ' (behind a transaction pooler LISTEN hears nothing: set DATABASE_DIRECT_URL)'
        : ''
      const [err, reason] = sending.sent
        ? [new Error('probe notification not heard'), 'change feed did not hear its own notification within ' +
            `${probeTimeoutMs} ms; serving lists from the database${hint}`]
        : [sending.err, 'change feed could not send its probe notification; serving lists from the database']
      // One warning when the feed stops hearing, not one per attempt while it stays deaf.
      this.drop(client, this.reportedDeaf ? undefined : err, reason)
      this.reportedDeaf = true
      return
    }
    this.lastEchoMs = performance.now() - sent
    if (!this.listening) {
      this.listening = true
      this.settled = true
      // Changes committed before we heard were never announced to us.
      this.changedEverywhere()
      for (const subscriber of this.subscribers.values()) subscriber.hearing?.()
      const again = this.attempt > 0 || this.reportedDeaf
      const fields = { echoMs: Math.round(this.lastEchoMs), connection: this.connectionName }
      this.options.log.info(again ? { ...fields, attempts: this.attempt } : fields,
        `change feed hears notifications${again ? ' again' : ''}; serving lists from the cache`)
    }
    this.attempt = 0
    this.reportedDeaf = false
    this.deafConnections = 0
    const proveAgain = (): void => { this.prove(client).catch((err: unknown) => { this.drop(client, err) }) }
    this.probeTimer = setTimeout(proveAgain, this.options.probeIntervalMs).unref()
  }
}

/** Another probe (an older one, another instance's, one on a change channel) is never a change. */
export function notificationKind (channel: string, payload: string,
  state: { awaitedProbe: string | undefined, subscribed: (channel: string) => boolean }):
  'awaited-probe' | 'other-probe' | 'change' | 'unsubscribed' {
  if (!payload.startsWith(PROBE_PREFIX)) return state.subscribed(channel) ? 'change' : 'unsubscribed'
  return channel === PROBE_CHANNEL && payload === state.awaitedProbe ? 'awaited-probe' : 'other-probe'
}

async function sendWithin (sending: Promise<void>, ms: number): Promise<{ sent: boolean, err?: unknown }> {
  const timeout = new AbortController()
  const late = delay(ms, { sent: false, err: new Error(`not sent within ${ms} ms`) }, { signal: timeout.signal })
  const settled = sending.then(() => ({ sent: true }), (err: unknown) => ({ sent: false, err }))
  return await Promise.race([settled, late]).finally(() => { timeout.abort() })
}
