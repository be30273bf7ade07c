import { Counter, Histogram, type Registry } from 'prom-client'
import type { CategoryRepository } from './repository.js'
import type { Category, NewCategory } from './schemas.js'

interface PendingCreate {
  category: NewCategory
  resolve: (category: Category) => void
  reject: (err: unknown) => void
}

export interface CreateBatcherOptions {
  /** Most rows in one INSERT; the rest wait for the next batch. */
  maxRows?: number
  /** Batches running at once (each holds one pool connection). */
  maxInFlight?: number
  registry?: Registry
  /** Told of every batch before any of its requests is answered: the rows it committed, or that it failed (its outcome is then unknown). */
  observer?: CreateObserver
}

export interface CreateObserver {
  created: (categories: Category[]) => void
  createFailed: () => void
}

/**
 * Group commit: concurrent creates go into one multi-row INSERT. When no batch is
 * running, the queue is flushed at the end of the current I/O turn (setImmediate),
 * so a lone request waits for nothing; while a batch runs, new requests gather
 * for the next one. Every request gets its own row and id, resolves only after
 * the batch committed, and fails with the batch's error if it failed.
 */
export class CategoryCreateBatcher {
  private queue: PendingCreate[] = []
  private inFlight = 0
  private flushScheduled = false
  private readonly maxRows: number
  private readonly maxInFlight: number
  private readonly batchRows: Histogram | undefined
  private readonly failedBatches: Counter | undefined
  private readonly observer: CreateObserver | undefined

  constructor (private readonly repository: Pick<CategoryRepository, 'insertBatch'>, options: CreateBatcherOptions = {}) {
    this.maxRows = options.maxRows ?? 256
    this.maxInFlight = options.maxInFlight ?? 1
    this.observer = options.observer
    const registers = options.registry === undefined ? undefined : [options.registry]
    if (registers !== undefined) {
      this.batchRows = new Histogram({
        name: 'categories_insert_batch_rows',
        help: 'Rows per group-commit INSERT of categories',
        buckets: [1, 2, 5, 10, 20, 50, 100, 200],
        registers
      })
      this.failedBatches = new Counter({ name: 'categories_insert_batch_failures_total', help: 'Group-commit INSERTs that failed (every request in them failed)', registers })
    }
  }

  async create (category: NewCategory): Promise<Category> {
    return await new Promise<Category>((resolve, reject) => {
      this.queue.push({ category, resolve, reject })
      this.scheduleFlush()
    })
  }

  private scheduleFlush (): void {
    if (this.flushScheduled || this.inFlight >= this.maxInFlight || this.queue.length === 0) return
    this.flushScheduled = true
    setImmediate(() => {
      this.flushScheduled = false
      this.flush()
    })
  }

  private flush (): void {
    if (this.inFlight >= this.maxInFlight || this.queue.length === 0) return
    const batch = this.queue.splice(0, this.maxRows)
    this.inFlight++
    this.batchRows?.observe(batch.length)
    this.repository.insertBatch(batch.map(pending => pending.category)).then(
      categories => {
        this.observer?.created(categories)
        batch.forEach((pending, i) => { pending.resolve(categories[i] as Category) })
      },
      (err: unknown) => {
        this.failedBatches?.inc()
        this.observer?.createFailed()
        for (const pending of batch) pending.reject(err)
      }
    ).finally(() => {
      this.inFlight--
      // Whatever gathered while this batch ran goes now, without waiting for another turn.
      this.flush()
      this.scheduleFlush()
    })
  }
}
