import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type pg from 'pg'
import type { Registry } from 'prom-client'
import { ChangeFeed, notifyThrough } from '../machinery/change-feed.js'
import { IdempotencyStore } from '../machinery/idempotency.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** The pool every resource's repository uses (app.ts makes it). */
    pool: pg.Pool
    /** One LISTENing connection for every resource's list cache (each subscribes to its table's channel while it registers). */
    changeFeed: ChangeFeed
    /** Idempotency-Key records, shared by every operation (each names its own). */
    idempotency: IdempotencyStore
  }
}

export interface DataOptions {
  pool: pg.Pool
  /** Where the feed LISTENs, and which setting that address came from (for its logs and metrics). */
  listen: { connectionString: string, connectionName: string }
  /** The pool's application_name: the change notifications this instance's writes cause carry it, and the feed skips them. */
  writerName: string
  /** How long the feed's probe may take to be sent through the pool (it may wait for a connection first). */
  probeSendTimeoutMs: number
  /** Checks each new feed connection like the pool's (db/servers.ts). */
  onConnect: (client: pg.Client) => Promise<void>
  /** How often expired Idempotency-Key records are deleted, off the request path. */
  idempotencyCleanupMs: number
  registry: Registry
}

/**
 * The machinery every resource shares, over the pool: the change feed (started
 * once every resource has subscribed, when the app is ready) and the
 * Idempotency-Key store. Resources declare `dependencies: ['data']`.
 */
async function data (app: FastifyInstance, options: DataOptions): Promise<void> {
  const { pool } = options
  const feed = new ChangeFeed({
    ...options.listen,
    notify: notifyThrough(pool),
    probeSendTimeoutMs: options.probeSendTimeoutMs,
    ownWriterName: options.writerName,
    log: app.log,
    onConnect: options.onConnect
  })
  const idempotency = new IdempotencyStore(pool)
  app.decorate('pool', pool)
  app.decorate('changeFeed', feed)
  app.decorate('idempotency', idempotency)
  app.addHook('onReady', async () => { feed.start() })
  app.addHook('onClose', async () => { await feed.close() })
  idempotency.startCleanup(options.idempotencyCleanupMs, (err) => { app.log.warn({ err }, 'deleting expired idempotency keys failed') })
  app.addHook('onClose', async () => { idempotency.stopCleanup() })
}

export default fp(data, { name: 'data' })
