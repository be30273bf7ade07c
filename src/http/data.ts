import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { Database, type DatabaseOptions } from '../db/database.js'
import { registerPoolMetrics } from './metrics.js'
import type { Row } from '../db/table.js'
import { ChangeFeed, notifyThrough } from '../machinery/change-feed.js'
import { Collection, type CollectionOptions } from '../machinery/collection.js'
import { IdempotencyStore } from '../machinery/idempotency.js'
import { StartupError } from '../startup-error.js'

declare module 'fastify' {
  interface FastifyInstance {
    db: Database
    changeFeed: ChangeFeed
    collection: <New extends object, T extends Row>(options: CollectionOptions<T>) => Collection<New, T>
    /** Refuses (StartupError) when a collection's table or its change-notification triggers are missing. */
    verifyTables: () => Promise<void>
    /**
     * Whether every collection's list has been built once (or the feed cannot vouch for a cache, and nothing is kept):
     * readiness waits for it at start. Asked before that, it starts the builds that are not under way.
     */
    listsWarm: () => boolean
  }
}

export interface DataOptions {
  database: DatabaseOptions
  listen: { connectionString: string, connectionName: string }
  idempotencyCleanupMs: number
}

/** Beyond what the pool itself may take to connect and run it: a probe's send is late only past this. */
const PROBE_SEND_MARGIN_MS = 1000

/** What every resource shares: the database, one change feed (started when the app is ready), idempotency. */
async function data (app: FastifyInstance, options: DataOptions): Promise<void> {
  const db = new Database(options.database)
  const { connectionTimeoutMs, statementTimeoutMs } = options.database
  const feed = new ChangeFeed({
    ...options.listen,
    notify: notifyThrough(db),
    // As long as the pool itself lets the probe wait for a connection and run.
    probeSendTimeoutMs: connectionTimeoutMs + statementTimeoutMs + PROBE_SEND_MARGIN_MS,
    log: app.log,
    onConnect: db.servers.register,
    registry: app.metrics
  })
  db.servers.onMove(() => { feed.reconnectIf(client => db.servers.isStale(client)) })
  const idempotency = new IdempotencyStore(db)
  registerPoolMetrics(app.metrics, db.pool)
  const collections: Array<Pick<Collection<object, Row>, 'table' | 'list'>> = []
  let warm = false
  app.decorate('db', db)
  app.decorate('changeFeed', feed)
  app.decorate('collection', <New extends object, T extends Row>(collection: CollectionOptions<T>) => {
    const made = new Collection<New, T>({ db, feed, idempotency, registry: app.metrics }, collection)
    collections.push(made)
    return made
  })
  app.decorate('verifyTables', async () => {
    for (const { table } of collections) {
      const problem = await table.problem()
      if (problem !== undefined) throw new StartupError(problem)
    }
  })
  app.decorate('listsWarm', () => {
    warm ||= collections.every(collection => collection.list.warmed)
    if (!warm) {
      for (const { list } of collections) {
        list.warm().catch((err: unknown) => { app.log.warn({ err }, 'a list could not be built') })
      }
    }
    return warm
  })
  app.addHook('onReady', async () => { feed.start() })
  idempotency.startCleanup(options.idempotencyCleanupMs, (err) => {
    app.log.warn({ err }, 'deleting expired idempotency keys failed')
  })
  app.addHook('onClose', async () => {
    idempotency.stopCleanup()
    await feed.close()
    await db.end()
  })
}

export default fp(data, { name: 'data', dependencies: ['metrics'] })
