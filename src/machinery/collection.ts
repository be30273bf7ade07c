import type pg from 'pg'
import type { Registry } from 'prom-client'
import type { ChangeFeed } from './change-feed.js'
import { CreateBatcher } from './create-batcher.js'
import { isIdempotencyRefusal, type IdempotencyStore, type StoredResponse } from './idempotency.js'
import { ListCache, type ListSerializer, type Row, type SerializedList } from './list-cache.js'

/** What a collection needs of its repository: batched inserts, one insert inside a caller's transaction, and the list in chunks. */
export interface CollectionRepository<New, Created extends Row> {
  insertBatch: (inputs: New[]) => Promise<Created[]>
  insertWith: (client: pg.ClientBase, input: New) => Promise<Created>
  listInChunks: (onChunk: (rows: Created[]) => void) => Promise<void>
}

export interface CollectionOptions<New, Created extends Row> {
  repository: CollectionRepository<New, Created>
  feed: ChangeFeed
  /** The channel the table's trigger notifies with the writer's application_name. */
  channel: string
  idempotency: IdempotencyStore
  /** The operation its idempotency records belong to (the contract's operationId of the create). */
  createOperation: string
  /** The request as the operation understands it (idempotency.digestOf its parts): the same body hashes the same. */
  requestHash: (input: New) => Buffer
  /** Metric names start with this; `rowName` is one row in the metrics' help. */
  metricPrefix: string
  rowName: string
  registry?: Registry
  maxPendingRows?: number
}

/** What an idempotent create answered: its own row and response, or the remembered response of an earlier request. */
export type CreateOutcome<Created> =
  | { kind: 'created', row: Created, response: StoredResponse }
  | { kind: 'replay', response: StoredResponse }

/**
 * One resource's write path and list: every create goes through here, and here
 * alone the list cache is told of it, before the create's caller answers. A
 * route cannot forget to (the change feed skips this instance's own
 * notifications, so a write path that did not tell the cache would leave this
 * instance's list stale).
 *
 * - create: group commit (create-batcher.ts); the cache is told of each batch.
 * - createIdempotent: the row and the record of its answer in one transaction
 *   (idempotency.ts); the cache is told of the row, or that a failure left the
 *   table unknown (a refusal wrote nothing).
 * - cached / list: the serialized list (list-cache.ts).
 */
export class Collection<New, Created extends Row> {
  private readonly cache: ListCache<Created>
  private readonly batcher: CreateBatcher<New, Created>

  constructor (private readonly options: CollectionOptions<New, Created>) {
    const { repository, feed, channel, metricPrefix, rowName, registry, maxPendingRows } = options
    this.cache = new ListCache(repository, { feed, channel, metricPrefix, rowName, registry, maxPendingRows })
    this.batcher = new CreateBatcher(repository, { registry, metricPrefix, observer: this.cache })
  }

  /** Committed, and already in this instance's list. */
  async create (input: New): Promise<Created> {
    return await this.batcher.create(input)
  }

  /**
   * With an Idempotency-Key: the remembered answer for this owner, operation and key (a replay, or a refusal
   * thrown), or else the row created and `answer`'s response for it, committed together.
   */
  async createIdempotent (owner: Buffer, key: string, input: New, answer: (row: Created) => StoredResponse): Promise<CreateOutcome<Created>> {
    const { repository, idempotency, createOperation, requestHash } = this.options
    let outcome
    try {
      outcome = await idempotency.execute(owner, createOperation, key, requestHash(input), async client => {
        const row = await repository.insertWith(client, input)
        const response = answer(row)
        return { result: { row, response }, response }
      })
    } catch (err) {
      // A refusal wrote nothing; any other failure may have committed before its answer was lost.
      if (!isIdempotencyRefusal(err)) this.cache.createFailed()
      throw err
    }
    if (outcome.kind === 'replay') return outcome
    // Committed: the next list read on this instance must see it, whatever the change feed is doing.
    this.cache.created([outcome.result.row])
    return { kind: 'created', ...outcome.result }
  }

  /** The cached list when it can be served as it is (synchronous: a cache hit needs no promise), else undefined. */
  cached (): SerializedList | undefined { return this.cache.cached() }

  /** The list, from the cache or the database; `serialize` writes an array of rows exactly as the route's schema does. */
  async list (serialize: ListSerializer<Created>): Promise<SerializedList> { return await this.cache.read(serialize) }
}
