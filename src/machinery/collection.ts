import type pg from 'pg'
import type { Registry } from 'prom-client'
import type { Database } from '../db/database.js'
import { Table, type Row } from '../db/table.js'
import type { ChangeFeed } from './change-feed.js'
import { CreateBatcher } from './create-batcher.js'
import { digestOf, isIdempotencyRefusal, type IdempotencyStore, type StoredResponse } from './idempotency.js'
import { ListCache, type ListBody, type ListSerializer } from './list-cache.js'
import { ListCompressor, type ListEncoding } from './list-compression.js'

/** What every collection shares (the `data` plugin makes them once). */
export interface CollectionServices {
  db: Database
  feed: ChangeFeed
  idempotency: IdempotencyStore
  registry?: Registry
}

export interface CollectionOptions {
  /** The table (`id bigserial PRIMARY KEY` and the columns); its trigger notifies `<name>_changed`; metric names start with it. */
  name: string
  /** The columns a create writes and a read returns, with their SQL types: `{ name: 'text' }`. */
  columns: Record<string, string>
  /** The contract's operationId of the create: its Idempotency-Key records belong to it. */
  createOperation: string
}

/** What an idempotent create answered: its own row and response, or the remembered response of an earlier request. */
export type CreateOutcome<T> =
  | { kind: 'created', row: T, response: StoredResponse }
  | { kind: 'replay', response: StoredResponse }

/**
 * One resource's rows: its list (cached: list-cache.ts) and its one write path.
 * Every create goes through here, and here alone the list cache is told of it,
 * before the create's caller answers; a route cannot forget to.
 *
 * - create: group commit (create-batcher.ts); the cache is told of each batch.
 * - createIdempotent: the row and the record of its answer in one transaction
 *   (idempotency.ts); the cache is told of the row, or that a failure left the
 *   table unknown (a refusal wrote nothing).
 */
export class Collection<New extends object, T extends Row> {
  private readonly table: Table<New, T>
  private readonly cache: ListCache<T>
  private readonly compressor: ListCompressor
  private readonly batcher: CreateBatcher<New, T>
  private readonly columns: string[]

  constructor (private readonly services: CollectionServices, private readonly options: CollectionOptions) {
    const { name } = options
    this.columns = Object.keys(options.columns)
    this.table = new Table<New, T>(services.db, name, options.columns)
    this.cache = new ListCache(this.table, { feed: services.feed, channel: `${name}_changed`, metricPrefix: name, registry: services.registry })
    this.compressor = new ListCompressor({ metricPrefix: name, registry: services.registry })
    this.batcher = new CreateBatcher(this.table, { registry: services.registry, metricPrefix: name, observer: this.cache })
  }

  /** Committed, and already in this instance's list. */
  async create (input: New): Promise<T> {
    return await this.cache.writing(this.batcher.create(input))
  }

  /**
   * With an Idempotency-Key: the remembered answer for this owner, operation and key (a replay, or a refusal
   * thrown), or else the row created and `answer`'s response for it, committed together.
   */
  async createIdempotent (owner: Buffer, key: string, input: New, answer: (row: T) => StoredResponse): Promise<CreateOutcome<T>> {
    // The body as the operation understands it: the same values sent with other spacing or member order are the same body.
    const hash = digestOf(this.columns.map(column => (input as Record<string, unknown>)[column] ?? null))
    let outcome
    try {
      outcome = await this.cache.writing(this.services.idempotency.execute(owner, this.options.createOperation, key, hash, async (client: pg.ClientBase) => {
        const row = await this.table.insertWith(client, input)
        const response = answer(row)
        return { result: { row, response }, response }
      }))
    } catch (err) {
      // A refusal wrote nothing; any other failure may have committed before its answer was lost.
      if (!isIdempotencyRefusal(err)) this.cache.invalidate()
      throw err
    }
    if (outcome.kind === 'replay') return outcome
    this.cache.created([outcome.result.row])
    return { kind: 'created', ...outcome.result }
  }

  /** The list; `serialize` writes an array of rows exactly as the route's schema does. */
  async list (serialize: ListSerializer<T>): Promise<ListBody> {
    return await this.cache.read(serialize)
  }

  /** The list in a content coding: compressed once per list version, the reads meanwhile sharing it. */
  async compressed (list: ListBody, encoding: ListEncoding): Promise<ListBody> {
    return await this.compressor.compressed(list, encoding)
  }

  async get (id: bigint): Promise<T | undefined> {
    return await this.table.get(id)
  }
}
