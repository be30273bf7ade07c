import { Counter, Histogram, type Registry } from 'prom-client'
import { ConstraintViolationError } from '../db/errors.js'

interface PendingCreate<New, Created> { input: New, resolve: (row: Created) => void, reject: (err: unknown) => void }

interface CreateBatcherOptions<Created> {
  maxRows?: number
  maxInFlight?: number // batches running at once, each holding one pool connection
  registry?: Registry
  metricPrefix?: string // `widgets` gives widgets_insert_batch_rows; needed with `registry`
  /** Told of every batch before any of its requests is answered; invalidate: it failed, its outcome unknown. */
  observer?: { created: (rows: Created[]) => void, invalidate: () => void }
}

/**
 * Group commit: concurrent creates go into one multi-row INSERT. With no batch running, the queue is flushed at
 * the end of the current I/O turn (setImmediate), so a lone request waits for nothing.
 */
export class CreateBatcher<New, Created> {
  private queue: Array<PendingCreate<New, Created>> = []
  private inFlight = 0
  private readonly maxInFlight: number
  private readonly batchRows: Histogram | undefined
  private readonly failedBatches: Counter | undefined

  /** `insertBatch` writes every input in one statement, committed together; result i belongs to input i. */
  constructor (private readonly repository: { insertBatch: (inputs: New[]) => Promise<Created[]> },
    private readonly options: CreateBatcherOptions<Created> = {}) {
    this.maxInFlight = options.maxInFlight ?? 1
    const { registry, metricPrefix: prefix } = options
    if (registry === undefined) return
    if (prefix === undefined) throw new Error('a create batcher with a registry needs a metric prefix')
    this.batchRows = new Histogram({
      name: `${prefix}_insert_batch_rows`,
      help: `Rows per group-commit INSERT of ${prefix}`,
      buckets: [1, 2, 5, 10, 20, 50, 100, 200],
      registers: [registry]
    })
    this.failedBatches = new Counter({
      name: `${prefix}_insert_batch_failures_total`,
      help: 'Group-commit INSERTs that failed (every request in them failed)',
      registers: [registry]
    })
  }

  async create (input: New): Promise<Created> {
    return await new Promise<Created>((resolve, reject) => {
      this.queue.push({ input, resolve, reject })
      // The first to wait schedules the flush; while batches run, the one that ends takes the rest.
      if (this.queue.length === 1 && this.inFlight < this.maxInFlight) setImmediate(() => { this.flush() })
    })
  }

  private flush (): void {
    while (this.inFlight < this.maxInFlight && this.queue.length > 0) {
      const batch = this.queue.splice(0, this.options.maxRows ?? 256)
      this.inFlight++
      this.batchRows?.observe(batch.length)
      this.commit(batch).finally(() => {
        this.inFlight--
        this.flush() // whatever gathered while this batch ran goes now, without waiting for another turn
      }).catch(() => {})
    }
  }

  private async commit (batch: Array<PendingCreate<New, Created>>): Promise<void> {
    let rows: Created[]
    try {
      rows = await this.repository.insertBatch(batch.map(pending => pending.input))
    } catch (err) {
      if (err instanceof ConstraintViolationError) {
        // One refused row fails its whole statement: alone, each request gets its own outcome.
        if (batch.length > 1) for (const pending of batch) await this.commit([pending])
        else batch[0]?.reject(err)
        return
      }
      this.failedBatches?.inc()
      this.options.observer?.invalidate()
      for (const pending of batch) pending.reject(err)
      return
    }
    this.options.observer?.created(rows)
    batch.forEach((pending, i) => { pending.resolve(rows[i] as Created) })
  }
}
