import pg from 'pg'

export const CHANGE_CHANNEL = 'categories_changed'
/** Distinctive, so operators (and tests) can find the listening connection in pg_stat_activity. */
export const LISTENER_APPLICATION_NAME = 'petstore-categories-listener'

interface Log { warn: (obj: object, msg: string) => void, info: (obj: object, msg: string) => void }

export interface ChangeFeedOptions {
  connectionString: string
  /** Called on every notification not skipped (below), and whenever the feed connects or drops (the cache cannot trust itself then). */
  onChange: () => void
  /**
   * The application_name of this instance's own pool. The trigger sends the
   * writer's application_name as the payload, so a notification carrying this
   * name is the echo of a change this instance made and has already applied
   * itself; it is skipped. Unset: every notification counts.
   */
  ownWriterName?: string
  log: Log
  minBackoffMs?: number
  maxBackoffMs?: number
  /** A query on the listening connection this often proves it is still alive (a silent drop would otherwise go unnoticed). */
  heartbeatMs?: number
  connectionTimeoutMs?: number
}

/**
 * One dedicated connection (not from the pool) that LISTENs for changes to the
 * categories table. `listening` is true only while that connection is up and
 * subscribed; when it drops, the feed reconnects with exponential backoff.
 */
export class CategoryChangeFeed {
  listening = false
  /** How many times the connection was lost (or never made) since start. */
  drops = 0
  /** Notifications skipped as the echo of this instance's own writes. */
  ownEchoes = 0
  private client: pg.Client | undefined
  private closed = false
  private attempt = 0
  private retryTimer: NodeJS.Timeout | undefined
  private heartbeatTimer: NodeJS.Timeout | undefined
  private readonly minBackoffMs: number
  private readonly maxBackoffMs: number
  private readonly heartbeatMs: number
  private readonly connectionTimeoutMs: number

  constructor (private readonly options: ChangeFeedOptions) {
    this.minBackoffMs = options.minBackoffMs ?? 250
    this.maxBackoffMs = options.maxBackoffMs ?? 5000
    this.heartbeatMs = options.heartbeatMs ?? 5000
    this.connectionTimeoutMs = options.connectionTimeoutMs ?? 2000
  }

  start (): void {
    this.connect().catch((err: unknown) => { this.options.log.warn({ err }, 'category change feed failed to start') })
  }

  async close (): Promise<void> {
    this.closed = true
    clearTimeout(this.retryTimer)
    clearInterval(this.heartbeatTimer)
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
    const drop = (err?: unknown): void => {
      if (dropped) return
      dropped = true
      const wasListening = this.listening
      this.listening = false
      clearInterval(this.heartbeatTimer)
      if (this.client === client) this.client = undefined
      client.end().catch(() => {})
      if (this.closed) return
      this.drops++
      this.options.onChange()
      const delay = Math.min(this.maxBackoffMs, this.minBackoffMs * 2 ** this.attempt) * (0.75 + Math.random() * 0.5)
      this.attempt++
      this.options.log.warn({ err, retryInMs: Math.round(delay), wasListening }, 'category change feed disconnected; serving the list from the database')
      this.retryTimer = setTimeout(() => { this.start() }, delay)
      this.retryTimer.unref()
    }
    client.on('error', drop)
    client.on('end', () => { drop(new Error('listening connection ended')) })
    client.on('notification', (message) => {
      if (message.channel !== CHANGE_CHANNEL) return
      if (this.options.ownWriterName !== undefined && message.payload === this.options.ownWriterName) {
        this.ownEchoes++
        return
      }
      this.options.onChange()
    })
    try {
      await client.connect()
      await client.query(`LISTEN ${CHANGE_CHANNEL}`)
    } catch (err) {
      drop(err)
      return
    }
    if (dropped || this.closed) {
      if (this.closed) await client.end().catch(() => {})
      return
    }
    if (this.attempt > 0) this.options.log.info({ attempts: this.attempt }, 'category change feed reconnected')
    this.attempt = 0
    this.listening = true
    // Changes committed while we were not listening were never announced to us.
    this.options.onChange()
    this.heartbeatTimer = setInterval(() => {
      client.query('SELECT 1').catch(drop)
    }, this.heartbeatMs)
    this.heartbeatTimer.unref()
  }
}
