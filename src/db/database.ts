import pg from 'pg'
import { DatabaseUnavailableError, POOL_QUEUE_FULL, databaseError } from './errors.js'
import { DatabaseServers, outcomeUnknown } from './servers.js'

/** The server cancels a slow statement itself; the client gives up this much later (a lost network). */
const QUERY_TIMEOUT_MARGIN_MS = 1000

/** int8 as BigInt: a JavaScript number would round ids above 2^53. */
const types = new pg.TypeOverrides()
types.setTypeParser(pg.types.builtins.INT8, BigInt)

export interface DatabaseOptions {
  connectionString: string
  /** How the pool's sessions are named in pg_stat_activity. */
  applicationName: string
  max: number
  /** Requests allowed to wait for a connection when every connection is busy; beyond that, 503 at once. */
  maxWaiting: number
  connectionTimeoutMs: number
  statementTimeoutMs: number
  log: (fields: object, message: string) => void
}

/** The one way to the database: failures mapped once (errors.ts), connections checked (servers.ts), waits bounded. */
export class Database {
  readonly pool: pg.Pool
  readonly servers: DatabaseServers
  private readonly stale = new Error('a connection to a server the database address no longer leads to')
  /** Unbounded waits in pg-pool's queue now: they take no request's place. */
  private unboundedWaiting = 0

  constructor (private readonly options: DatabaseOptions) {
    this.servers = new DatabaseServers(options.log)
    this.pool = new pg.Pool({
      connectionString: options.connectionString,
      application_name: options.applicationName,
      max: options.max,
      connectionTimeoutMillis: options.connectionTimeoutMs,
      // The server cancels a slow statement; this bounds what it cannot end (a lost network, a standby's commit).
      query_timeout: options.statementTimeoutMs + QUERY_TIMEOUT_MARGIN_MS,
      idleTimeoutMillis: 30000,
      types,
      onConnect: this.servers.register
    })
    // Unheard, a dying connection crashes the process: idle ones report here, and pg-pool leaves checked-out ones
    // without a listener (their query rejects on its own).
    this.pool.on('error', err => { options.log({ err }, 'idle database connection failed') })
    this.pool.on('connect', client => { client.on('error', () => {}) })
  }

  async query<R extends pg.QueryResultRow = pg.QueryResultRow> (text: string, values: unknown[] = [],
    options: { bounded?: boolean } = {}): Promise<pg.QueryResult<R>> {
    return await this.withClient(async client => await client.query<R>({ text, values }), options)
  }

  async transaction<T> (work: (client: pg.PoolClient) => Promise<T>, begin = 'BEGIN'): Promise<T> {
    return await this.withClient(async client => {
      await client.query(begin)
      const result = await work(client)
      await client.query('COMMIT')
      return result
    })
  }

  /**
   * One connection for `work`, closed after any failure (it may be mid-transaction or lost). `bounded: false` may
   * wait past a full queue: the change feed's probe must not be refused for the requests' overload, nor take a place.
   */
  async withClient<T> (work: (client: pg.PoolClient) => Promise<T>, { bounded = true } = {}): Promise<T> {
    const { pool } = this
    if (bounded && pool.idleCount === 0 && pool.totalCount >= this.options.max &&
      pool.waitingCount - this.unboundedWaiting >= this.options.maxWaiting) {
      const queueFull = Object.assign(new Error('the connection pool queue is full'), { code: POOL_QUEUE_FULL })
      throw new DatabaseUnavailableError(queueFull)
    }
    const client = await this.acquire(bounded).catch((err: unknown) => { throw databaseError(err) })
    try {
      const result = await work(client)
      this.servers.confirmReplicated(client)
      client.release(this.servers.isStale(client) ? this.stale : undefined)
      return result
    } catch (err) {
      client.release(err instanceof Error ? err : true)
      if (outcomeUnknown(err)) this.servers.recheck(this.openOne)
      throw databaseError(err)
    }
  }

  async end (): Promise<void> {
    await this.pool.end()
  }

  /** A connection that leads where the address does now; those to an old server are closed on the way. */
  private async acquire (bounded: boolean): Promise<pg.PoolClient> {
    for (;;) {
      const queuedBefore = this.pool.waitingCount
      const connecting = this.pool.connect()
      // pg-pool queues a wait synchronously (or opens a new connection without queueing it).
      const queued = !bounded && this.pool.waitingCount > queuedBefore
      if (queued) this.unboundedWaiting++
      const client = await connecting.finally(() => { if (queued) this.unboundedWaiting-- })
      if (!this.servers.isStale(client)) return client
      client.release(this.stale)
    }
  }

  private readonly openOne = async (): Promise<pg.Client> => {
    const { connectionString, applicationName, connectionTimeoutMs } = this.options
    const client = new pg.Client({
      connectionString, application_name: applicationName, connectionTimeoutMillis: connectionTimeoutMs
    })
    client.on('error', () => {})
    await client.connect()
    return client
  }
}
