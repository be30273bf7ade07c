import { Counter, Histogram, type Registry } from 'prom-client'
import { ConstraintViolationError } from '../db/errors.js'

interface Pending<I, O> { input: I, resolve: (output: O) => void, reject: (err: unknown) => void }

/** The most rows one statement of a batch writes. */
const MAX_BATCH_ROWS = 256
const BATCH_SIZES = [1, 2, 5, 10, 20, 50, 100, 200]

export interface GroupCommitOptions<I, O> {
  /** Writes every input in one statement, committed together; output i belongs to input i. */
  write: (inputs: I[]) => Promise<O[]>
  /** Inputs with one key (two writes of one row) never share a batch: one statement would merge them. */
  keyOf?: (input: I) => unknown
  maxRows?: number
  /** Batches running at once, each holding one pool connection. */
  maxInFlight?: number
  /** `categories_insert` gives categories_insert_batch_rows and categories_insert_batch_failures_total. */
  metrics?: { registry: Registry, name: string }
  /** Told of every batch before any of its requests is answered; `failed`: a batch whose outcome is unknown. */
  observer?: { committed: (outputs: O[]) => void, failed: () => void }
}

/**
 * Group commit: concurrent writes go into one statement, one transaction and one notification. With no batch
 * running, the queue is flushed at the end of the current I/O turn (setImmediate), so a lone request waits for
 * nothing; while batches run, the one that ends takes what gathered meanwhile.
 */
export class GroupCommit<I, O> {
  private queue: Array<Pending<I, O>> = []
  private inFlight = 0
  private readonly maxRows: number
  private readonly maxInFlight: number
  private readonly batchRows: Histogram | undefined
  private readonly failedBatches: Counter | undefined

  constructor (private readonly options: GroupCommitOptions<I, O>) {
    this.maxRows = options.maxRows ?? MAX_BATCH_ROWS
    this.maxInFlight = options.maxInFlight ?? 1
    const { metrics } = options
    if (metrics === undefined) return
    this.batchRows = new Histogram({
      name: `${metrics.name}_batch_rows`,
      help: `Rows per group-commit statement (${metrics.name})`,
      buckets: BATCH_SIZES,
      registers: [metrics.registry]
    })
    this.failedBatches = new Counter({
      name: `${metrics.name}_batch_failures_total`,
      help: `Group-commit statements (${metrics.name}) that failed: every request in them failed`,
      registers: [metrics.registry]
    })
  }

  async write (input: I): Promise<O> {
    return await new Promise<O>((resolve, reject) => {
      this.queue.push({ input, resolve, reject })
      // The first to wait schedules the flush; while batches run, the one that ends takes the rest.
      if (this.queue.length === 1 && this.inFlight < this.maxInFlight) setImmediate(() => { this.flush() })
    })
  }

  private flush (): void {
    while (this.inFlight < this.maxInFlight && this.queue.length > 0) {
      const batch = this.nextBatch()
      this.inFlight++
      this.batchRows?.observe(batch.length)
      this.commit(batch).finally(() => {
        this.inFlight--
        this.flush() // whatever gathered while this batch ran goes now, without waiting for another turn
      }).catch(() => {})
    }
  }

  /** Up to maxRows from the queue in arrival order; an input whose key the batch has waits for the next one. */
  private nextBatch (): Array<Pending<I, O>> {
    const { keyOf } = this.options
    if (keyOf === undefined) return this.queue.splice(0, this.maxRows)
    const keys = new Set<unknown>()
    const batch: Array<Pending<I, O>> = []
    const waiting: Array<Pending<I, O>> = []
    for (const pending of this.queue) {
      const key = keyOf(pending.input)
      if (batch.length < this.maxRows && !keys.has(key)) {
        keys.add(key)
        batch.push(pending)
      } else {
        waiting.push(pending)
      }
    }
    this.queue = waiting
    return batch
  }

  private async commit (batch: Array<Pending<I, O>>): Promise<void> {
    let outputs: O[]
    try {
      outputs = await this.options.write(batch.map(pending => pending.input))
    } catch (err) {
      if (err instanceof ConstraintViolationError) {
        // One refused row fails its whole statement: alone, each request gets its own outcome.
        if (batch.length > 1) for (const pending of batch) await this.commit([pending])
        else batch[0]?.reject(err)
        return
      }
      this.failedBatches?.inc()
      this.options.observer?.failed()
      for (const pending of batch) pending.reject(err)
      return
    }
    this.options.observer?.committed(outputs)
    batch.forEach((pending, i) => { pending.resolve(outputs[i] as O) })
  }
}
