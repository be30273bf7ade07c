import type { Registry } from 'prom-client'
import type { Database } from '../db/database.js'
import { ConstraintViolationError } from '../db/errors.js'
import { Table, type Precondition, type Refusal, type Row, type RowUpdate, type Versioned } from '../db/table.js'
import type { ChangeFeed } from './change-feed.js'
import { GroupCommit } from './group-commit.js'
import { IdempotencyRefusal, type IdempotencyStore, type Outcome, type StoredResponse } from './idempotency.js'
import { ListCache, type RowSerializer } from './list-cache.js'
import { listCompressor, type ListEncoding } from './list-compression.js'
import type { ListBody } from './segmented-list.js'

export interface CollectionOptions<T> {
  /** The table; its triggers notify `<name>_changed`; metric names start with it. */
  name: string
  /** The columns a create writes and a read returns, with their SQL types (db/table.ts columnsOf). */
  columns: Record<string, string>
  /** The operationId of the create: its Idempotency-Key records belong to it. */
  createOperation: string
  /** One row as the list's JSON (the item schema's serializer): how a changed row enters the cached list. */
  serialize: RowSerializer<T>
}

/**
 * One resource's rows: its cached list and its one write path. Every create, update and delete goes through here,
 * and here the list cache is told of it before the caller answers, so a route cannot forget to.
 */
export class Collection<New extends object, T extends Row> {
  readonly table: Table<New, T>
  /** The cached list's reads; its writes are told only here, by the write path below. */
  readonly list: Pick<ListCache<T>, 'read' | 'page' | 'warm' | 'warmed'>
  private readonly cache: ListCache<T>
  readonly compressed: (list: ListBody, encoding: ListEncoding) => Promise<ListBody>
  private readonly creates: GroupCommit<New, T>
  private readonly updates: GroupCommit<RowUpdate, Versioned<T> | Refusal>
  private readonly deletes: GroupCommit<{ id: bigint, versions: Precondition }, 'deleted' | Refusal>

  constructor (
    private readonly services: { db: Database, feed: ChangeFeed, idempotency: IdempotencyStore, registry: Registry },
    private readonly options: CollectionOptions<T>) {
    const { name, columns } = options
    const { feed, registry } = services
    this.table = new Table<New, T>(services.db, name, columns)
    this.cache = new ListCache(this.table, feed, options.serialize, registry)
    this.list = this.cache
    this.compressed = listCompressor(name, registry)
    const { table, cache } = this
    this.creates = new GroupCommit({
      write: async inputs => await table.insertBatch(inputs),
      metrics: { registry, name: `${name}_insert` },
      observer: { committed: rows => { cache.created(rows) }, failed: () => { cache.invalidate() } }
    })
    this.updates = new GroupCommit({
      write: async updates => await table.updateBatch(updates),
      keyOf: update => update.id,
      metrics: { registry, name: `${name}_update` }
    })
    this.deletes = new GroupCommit({
      write: async deletes => await table.deleteBatch(deletes),
      keyOf: d => d.id,
      metrics: { registry, name: `${name}_delete` }
    })
  }

  /** Committed (group commit), and already in this instance's list. */
  async create (input: New): Promise<T> {
    return await this.cache.writing(this.creates.write(input))
  }

  /** With an Idempotency-Key: the remembered answer (or a refusal thrown), or the row and its answer, committed. */
  async createIdempotent (owner: Buffer, key: string, input: New, answer: (row: T) => StoredResponse):
  Promise<Outcome<T>> {
    let outcome: Outcome<T>
    try {
      // The values, not the bytes: the same body with other spacing or member order is the same body.
      outcome = await this.cache.writing(this.services.idempotency.execute(owner, this.options.createOperation, key,
        this.table.values(input), async client => {
          const row = await this.table.insertWith(client, input)
          return { result: row, response: answer(row) }
        }))
    } catch (err) {
      // A refusal wrote nothing; any other failure may have committed before its answer was lost.
      if (!(err instanceof IdempotencyRefusal) && !(err instanceof ConstraintViolationError)) this.cache.invalidate()
      throw err
    }
    if (outcome.kind === 'created') this.cache.created([outcome.result])
    return outcome
  }

  /** An empty merge patch: the row as it is, when its version is one `versions` names. */
  private async unchanged (id: bigint, versions: Precondition): Promise<Versioned<T> | Refusal> {
    const found = await this.table.get(id)
    if (found === undefined) return 'missing'
    return versions === undefined || versions.includes(found.version) ? found : 'mismatch'
  }

  /** A merge patch (null: the member removed), when the row's version is one `versions` names (group commit). */
  async update (id: bigint, patch: Record<string, unknown>, versions: Precondition): Promise<Versioned<T> | Refusal> {
    if (!this.table.columns.some(column => column in patch)) return await this.unchanged(id, versions)
    return await this.cache.updating(id, this.updates.write({ id, patch, versions }),
      outcome => typeof outcome === 'string' ? undefined : outcome)
  }

  /** Deletes the row when its version is one `versions` names (group commit). */
  async delete (id: bigint, versions: Precondition): Promise<'deleted' | Refusal> {
    const outcome = await this.deletes.write({ id, versions })
    if (outcome === 'deleted') this.cache.deleted([id])
    return outcome
  }
}
