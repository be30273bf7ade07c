import pg from 'pg'
import { poolClientClass } from './pool-client.js'
import { DatabaseServers, outcomeUnknown } from './servers.js'

const INT8_OID = 20

/** int8 (bigserial ids, counts) as BigInt: a JavaScript number would round ids above 2^53. */
const types = {
  getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
    oid === INT8_OID ? BigInt : pg.types.getTypeParser(oid, format ?? 'text')) as typeof pg.types.getTypeParser
}

export interface PoolOptions {
  connectionString: string
  max: number
  connectionTimeoutMs: number
  statementTimeoutMs: number
  /** Prepare statements once per connection (only where connections keep their session: see pool-client.ts). */
  preparedStatements?: boolean
  /** Queries allowed to wait for a connection when every connection is busy; beyond that, fail at once. */
  maxWaiting?: number
  /** How the pool's sessions are named in pg_stat_activity, and in the change notifications their writes cause (see machinery/change-feed.ts). */
  applicationName?: string
  /** Checks every new connection: no standby, and no connection left on a server the address no longer leads to (db/servers.ts). */
  servers?: DatabaseServers
}

/** Thrown (as a 503, see db/errors.ts) when the pool's wait queue is full: overload is answered at once, not queued without bound. */
export const POOL_QUEUE_FULL = 'EPOOLQUEUEFULL'

/**
 * pg.Pool queues without limit; this caps the queue. pool.query() goes through
 * pool.connect(), so one wrapper covers both.
 */
function boundQueue (pool: pg.Pool, max: number, maxWaiting: number): void {
  const connect = pool.connect.bind(pool)
  const outside = { connect: async () => await connect(), waiting: 0 }
  outsideTheBound.set(pool, outside)
  pool.connect = ((callback?: (err: Error | undefined, client?: pg.PoolClient, done?: (release?: unknown) => void) => void) => {
    if (pool.idleCount === 0 && pool.totalCount >= max && pool.waitingCount - outside.waiting >= maxWaiting) {
      const err = Object.assign(new Error('the connection pool queue is full'), { code: POOL_QUEUE_FULL })
      if (callback === undefined) return Promise.reject(err)
      process.nextTick(() => { callback(err) })
      return undefined
    }
    return callback === undefined ? connect() : connect(callback as Parameters<typeof connect>[0])
  }) as typeof pool.connect
}

/** Bounded pools: their connect() without the bound, and how many waits outside the bound are in pg-pool's queue now. */
const outsideTheBound = new WeakMap<pg.Pool, { connect: () => Promise<pg.PoolClient>, waiting: number }>()

/**
 * One statement that neither counts against DB_POOL_MAX_WAITING nor is refused by it: the change
 * feed's probe (one at a time, machinery/change-feed.ts) must not take a request's place in the
 * wait queue. It still waits no longer than the pool's connection timeout.
 */
export async function queryOutsideQueueBound (pool: pg.Pool, text: string, values: unknown[]): Promise<void> {
  const outside = outsideTheBound.get(pool)
  if (outside === undefined) {
    await pool.query(text, values)
    return
  }
  const queuedBefore = pool.waitingCount
  const connecting = outside.connect()
  // pg-pool queues the wait synchronously, or opens a new connection without queueing it.
  const queued = pool.waitingCount > queuedBefore
  if (queued) outside.waiting++
  let client: pg.PoolClient
  try {
    client = await connecting
  } finally {
    if (queued) outside.waiting--
  }
  try {
    await client.query(text, values)
    client.release()
  } catch (err) {
    client.release(err instanceof Error ? err : true)
    throw err
  }
}

/** Its caller hears of a lost connection through its failed query, and the pool's 'error' event reports idle ones. */
function ignoreLostConnection (): void {}

export function createPool (options: PoolOptions, onError: (err: Error) => void): pg.Pool {
  const servers = options.servers ?? new DatabaseServers()
  const pool = new pg.Pool({
    connectionString: options.connectionString,
    max: options.max,
    // Bounded waits: a request never hangs on an unreachable database or an exhausted pool.
    connectionTimeoutMillis: options.connectionTimeoutMs,
    // Not the statement_timeout option: a startup parameter that poolers refuse (see pool-client.ts).
    Client: poolClientClass({ statementTimeoutMs: options.statementTimeoutMs, preparedStatements: options.preparedStatements ?? false, applicationName: options.applicationName ?? 'petstore' }),
    query_timeout: options.statementTimeoutMs + 1000,
    idleTimeoutMillis: 30000,
    application_name: options.applicationName ?? 'petstore',
    types,
    onConnect: servers.register
  })
  // Without this listener an idle client's error (database restart) crashes the process.
  pool.on('error', onError)
  // pg-pool listens only while a client is idle: a checked-out client (pool.connect) whose connection dies
  // would crash the process. This one stays for the client's life; the query in flight rejects on its own.
  pool.on('connect', client => { client.on('error', ignoreLostConnection) })
  // A connection closed with its statement's outcome unknown may mean the address moved (db/servers.ts): ask where it leads.
  const openOne = async (): Promise<pg.Client> => {
    const client = new pg.Client({ connectionString: options.connectionString, application_name: options.applicationName ?? 'petstore', connectionTimeoutMillis: options.connectionTimeoutMs })
    client.on('error', ignoreLostConnection)
    await client.connect()
    return client
  }
  pool.on('release', (err: unknown) => { if (outcomeUnknown(err)) servers.recheck(openOne) })
  if (options.maxWaiting !== undefined) boundQueue(pool, options.max, options.maxWaiting)
  return pool
}
