import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import type { Registry } from 'prom-client'
import { Database, type DatabaseOptions } from '../db/database.js'
import type { Row } from '../db/table.js'
import { ChangeFeed, notifyThrough } from '../machinery/change-feed.js'
import { Collection, type CollectionOptions } from '../machinery/collection.js'
import { IdempotencyStore } from '../machinery/idempotency.js'

declare module 'fastify' {
  interface FastifyInstance {
    /** The one way to the database (db/database.ts). */
    db: Database
    /** One LISTENing connection for every resource's list cache. */
    changeFeed: ChangeFeed
    /** A resource's rows: its cached list and its one write path (machinery/collection.ts). */
    collection: <New extends object, T extends Row>(options: CollectionOptions) => Collection<New, T>
  }
}

export interface DataOptions {
  database: DatabaseOptions
  /** Where the feed LISTENs, and which setting that address came from (for its logs and metrics). */
  listen: { connectionString: string, connectionName: string }
  /** How often expired Idempotency-Key records are deleted, off the request path. */
  idempotencyCleanupMs: number
  registry: Registry
}

/**
 * What every resource shares: the database, one change feed (started once every
 * resource has subscribed, when the app is ready) and the Idempotency-Key store.
 * Resources declare `dependencies: ['data']` and make their collections with
 * `app.collection(...)`.
 */
async function data (app: FastifyInstance, options: DataOptions): Promise<void> {
  const db = new Database(options.database)
  const feed = new ChangeFeed({
    ...options.listen,
    notify: notifyThrough(db),
    // As long as the pool itself lets the probe wait for a connection and run.
    probeSendTimeoutMs: options.database.connectionTimeoutMs + options.database.statementTimeoutMs + 1000,
    log: app.log,
    onConnect: db.servers.register
  })
  db.servers.onMove(() => { feed.reconnectIf(client => db.servers.isStale(client)) })
  const idempotency = new IdempotencyStore(db)
  app.decorate('db', db)
  app.decorate('changeFeed', feed)
  app.decorate('collection', <New extends object, T extends Row>(collection: CollectionOptions) =>
    new Collection<New, T>({ db, feed, idempotency, registry: options.registry }, collection))
  app.addHook('onReady', async () => { feed.start() })
  idempotency.startCleanup(options.idempotencyCleanupMs, (err) => { app.log.warn({ err }, 'deleting expired idempotency keys failed') })
  app.addHook('onClose', async () => {
    idempotency.stopCleanup()
    await feed.close()
    await db.end()
  })
}

export default fp(data, { name: 'data' })
