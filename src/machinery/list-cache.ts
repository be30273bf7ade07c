import { createHash, type Hash } from 'node:crypto'
import { Counter, Gauge, type Registry } from 'prom-client'
import type { ChangeFeed } from './change-feed.js'

/** What a list cache holds: rows with a bigint id, listed in id order. */
export interface Row { id: bigint }

/** Where a list is read from: every row in id order, in chunks, from one snapshot (a repository's cursor read). */
export interface ListSource<T extends Row> {
  listInChunks: (onChunk: (rows: T[]) => void) => Promise<void>
}

/** The list as sent on the wire, and its strong ETag. */
export interface SerializedList {
  /** UTF-8 bytes, encoded once: every response writes the same Buffer instead of re-encoding a string. */
  body: Buffer
  etag: string
}

export type ListSerializer<T extends Row = Row> = (list: T[]) => string

interface CachedList extends SerializedList {
  /** The last (highest) id in the list, undefined when it is empty: only higher ids can be appended in order. */
  lastId: bigint | undefined
  /** SHA-1 state over every byte of `body` but its closing `]`, so that an append hashes only what it adds. */
  openHash: Hash
  rows: number
}

const OPEN = 0x5b // [
const COMMA = 0x2c // ,
const CLOSE = 0x5d // ]

/** The smallest buffer a list is written into. */
const MIN_PART_BYTES = 8 * 1024

/**
 * A list body built from chunks of rows, each serialized by the route's own
 * serializer. That serializer writes an array as `[`, the items joined by `,`,
 * and `]`; the chunks' items are joined the same way, so the body is byte for
 * byte what serializing the whole list at once would give (test/list-cache.test.ts
 * compares them), while no more than one chunk exists as objects at a time.
 *
 * The bytes go straight into buffers: the first sized from `sizeHint` (the
 * last list's length), so that rebuilding a list that did not grow much is one
 * allocation and no copy; when it fills, the next is as large as everything
 * written so far, and the parts are joined once at the end. Nothing is copied
 * to grow. Started from a cached list, it appends: the cached bytes are reused
 * as they are, and only the new rows are serialized and hashed.
 */
export class ListBuilder<T extends Row> {
  /** Filled parts, in order; with a cached list to start from, the first is its bytes (never written to). */
  private readonly parts: Buffer[] = []
  private current: Buffer
  private used = 0
  /** Bytes in `parts` and `current`. */
  private total = 0
  /** Bytes this builder wrote itself (what the next part is sized from). */
  private written = 0
  private readonly hash: Hash
  private lastId: bigint | undefined
  private rows: number

  constructor (private readonly serialize: ListSerializer<T>, sizeHint: number, base?: CachedList) {
    this.rows = base?.rows ?? 0
    if (base === undefined) {
      this.current = Buffer.allocUnsafeSlow(Math.max(sizeHint, MIN_PART_BYTES))
      this.current[this.used++] = OPEN
      this.total = this.written = 1
      this.hash = createHash('sha1').update(this.current.subarray(0, 1))
      this.lastId = undefined
    } else {
      this.parts.push(base.body.subarray(0, base.body.length - 1)) // all but the closing ]
      this.total = base.body.length - 1
      this.current = Buffer.alloc(0)
      this.hash = base.openHash.copy()
      this.lastId = base.lastId
    }
  }

  /** Rows in id order, all after the ones already added. */
  add (rows: T[]): void {
    if (rows.length === 0) return
    const array = this.serialize(rows)
    if (array[0] !== '[' || array[array.length - 1] !== ']') throw new Error('the list serializer did not write a JSON array')
    const items = array.slice(1, -1)
    const comma = this.lastId !== undefined
    this.reserve((comma ? 1 : 0) + Buffer.byteLength(items, 'utf8'))
    const start = this.used
    if (comma) this.current[this.used++] = COMMA
    this.used += this.current.write(items, this.used, 'utf8')
    this.hash.update(this.current.subarray(start, this.used))
    this.total += this.used - start
    this.written += this.used - start
    this.lastId = (rows[rows.length - 1] as T).id
    this.rows += rows.length
  }

  finish (): CachedList {
    this.reserve(0) // reserve() always leaves room for the ]
    const openHash = this.hash.copy()
    this.current[this.used++] = CLOSE
    this.total++
    this.hash.update(this.current.subarray(this.used - 1, this.used))
    const last = this.current.subarray(0, this.used)
    let body: Buffer
    if (this.parts.length > 0) body = Buffer.concat([...this.parts, last], this.total)
    // One part, much larger than its content (the list shrank): keep only what is used.
    else body = this.current.length - this.used > this.used / 8 + 4096 ? Buffer.from(last) : last
    return { body, etag: `"${this.hash.digest('base64url')}"`, lastId: this.lastId, openHash, rows: this.rows }
  }

  /** Room in the current part for `bytes` more and the closing ]; a full part is kept and a new one started, nothing is copied. */
  private reserve (bytes: number): void {
    if (this.used + bytes + 1 <= this.current.length) return
    if (this.used > 0) this.parts.push(this.current.subarray(0, this.used))
    this.current = Buffer.allocUnsafeSlow(Math.max(bytes + 1, this.written))
    this.used = 0
  }
}

const byId = (a: Row, b: Row): number => a.id < b.id ? -1 : a.id > b.id ? 1 : 0

type ReadSource = 'cache' | 'appended' | 'refresh' | 'database'

export interface ListCacheOptions {
  /** The feed that tells of changes, and the channel the table's trigger notifies. */
  feed: ChangeFeed
  channel: string
  /** Metric names start with this (`widgets` gives widgets_list_reads_total, widgets_change_feed_listening...). */
  metricPrefix: string
  /** One row, for the metrics' help ('Widget' gives 'Widget list reads...'). */
  rowName: string
  registry?: Registry
  /** Own creates held for appending; beyond this many (nobody has read the list meanwhile) the cached list is dropped instead. */
  maxPendingRows?: number
}

/**
 * A resource's serialized list, kept in memory while the change feed hears
 * notifications (it proves it by hearing its own probes: change-feed.ts). While
 * the feed is down or deaf every read goes to the database.
 *
 * What changes the list:
 * - this instance's own creates (`created`, called before their 201s are sent)
 *   are appended to the cached list at the next read, when their ids sort after
 *   it; otherwise (ids out of order, or a refresh in flight) the list is dropped;
 * - a change from anywhere else (a notification that does not carry our pool's
 *   name) drops it, and so does a create whose outcome is unknown;
 * - a dropped list is rebuilt by the next read, in chunks (repository.listInChunks).
 * A generation counter stops a refresh that started before a drop from
 * installing its (possibly stale) result; concurrent readers share one refresh
 * instead of all querying at once.
 */
export class ListCache<T extends Row> {
  private generation = 0
  private entry: CachedList | undefined
  /** Own creates committed since `entry` was built, in id order, all after it; appended at the next read. */
  private pending: T[] = []
  private refreshing: { generation: number, promise: Promise<CachedList> } | undefined
  private readonly feed: ChangeFeed
  private readonly maxPendingRows: number
  /** Reads by source, plain numbers: the Counter below reads them when scraped (a prom-client inc() per read was about 1 µs of a cached GET). */
  private readonly reads: Record<ReadSource, number> = { cache: 0, appended: 0, refresh: 0, database: 0 }
  /** The last list built (its length and rows), and how many rows this instance created since: what a rebuild sizes its buffer from. */
  private lastBuilt = { bytes: 0, rows: 0 }
  private createdSinceBuilt = 0

  constructor (
    private readonly source: ListSource<T>,
    options: ListCacheOptions
  ) {
    this.feed = options.feed
    const subscription = options.feed.subscribe(options.channel, () => { this.invalidate() })
    this.maxPendingRows = options.maxPendingRows ?? 10_000
    if (options.registry !== undefined) {
      const registers = [options.registry]
      const prefix = options.metricPrefix
      const reads = this.reads
      // eslint-disable-next-line no-new
      new Counter({
        name: `${prefix}_list_reads_total`,
        help: `${options.rowName} list reads by source: cache, appended (cache plus this instance's own new rows), refresh (one query shared by waiting readers) or database (change feed down or deaf)`,
        labelNames: ['source'],
        registers,
        collect () {
          this.reset()
          for (const [source, count] of Object.entries(reads)) this.labels(source).inc(count)
        }
      })
      const feed = this.feed
      // eslint-disable-next-line no-new
      new Gauge({ name: `${prefix}_change_feed_listening`, help: '1 while the change feed hears notifications (its last probe was echoed) and the list cache may be used; 0: the list is read from the database', registers, collect () { this.set(feed.listening ? 1 : 0) } })
      // eslint-disable-next-line no-new
      new Gauge({ name: `${prefix}_change_feed_drops`, help: 'Times the change feed connection was lost, could not be made, or was found deaf', registers, collect () { this.set(feed.drops) } })
      // eslint-disable-next-line no-new
      new Gauge({ name: `${prefix}_change_feed_probes_missed`, help: 'Probe notifications the change feed sent through the pool and did not hear in time', registers, collect () { this.set(feed.probesMissed) } })
      // eslint-disable-next-line no-new
      new Gauge({ name: `${prefix}_change_feed_echo_seconds`, help: 'Time from sending the change feed\'s last heard probe notification to its echo', registers, collect () { this.set(feed.lastEchoMs === undefined ? NaN : feed.lastEchoMs / 1000) } })
      // eslint-disable-next-line no-new
      new Gauge({ name: `${prefix}_change_feed_connection_info`, help: 'The setting whose connection the change feed listens on (DATABASE_DIRECT_URL or DATABASE_URL)', labelNames: ['connection'], registers, collect () { this.labels(feed.connectionName).set(1) } })
      // eslint-disable-next-line no-new
      new Gauge({ name: `${prefix}_change_feed_own_echoes`, help: 'Notifications skipped because they announced this instance\'s own writes', registers, collect () { this.set(subscription.ownEchoes) } })
    }
  }

  /** True while the cache may be used (the change feed hears). */
  get listening (): boolean { return this.feed.listening }

  invalidate (): void {
    this.generation++
    this.entry = undefined
    this.pending = []
  }

  /** Rows this instance has committed. Must be called before their 201s are sent: the next read on this instance includes them. */
  created (rows: readonly T[]): void {
    if (rows.length === 0) return
    this.createdSinceBuilt += rows.length
    // No list, or one being rebuilt from a snapshot that may predate these rows: the rebuild must not be kept.
    if (this.entry === undefined) { this.invalidate(); return }
    const sorted = [...rows].sort(byId)
    const last = this.pending.length > 0 ? (this.pending[this.pending.length - 1] as T).id : this.entry.lastId
    // An id at or below the list's last one: the list may already hold the row (a snapshot taken after the
    // commit), or the row belongs in the middle. Either way, rebuild instead of appending.
    if ((last !== undefined && (sorted[0] as T).id <= last) || this.pending.length + sorted.length > this.maxPendingRows) {
      this.invalidate()
      return
    }
    this.pending.push(...sorted)
  }

  /** A create failed, perhaps after its commit (the connection dropped before the answer): what the table holds is unknown. */
  createFailed (): void { this.invalidate() }

  /**
   * The cached list, when read() would return it as it is (the feed is
   * listening and none of this instance's creates wait to be appended);
   * otherwise undefined. Synchronous: a cache hit needs no promise.
   */
  cached (): SerializedList | undefined {
    if (this.entry === undefined || this.pending.length > 0 || !this.feed.listening) return undefined
    this.count('cache')
    return this.entry
  }

  async read (serialize: ListSerializer<T>): Promise<SerializedList> {
    const hit = this.cached()
    if (hit !== undefined) return hit
    if (!this.feed.listening) {
      this.count('database')
      return await this.load(serialize)
    }
    if (this.entry !== undefined) {
      // Own creates wait to be appended (a list without any was a hit above).
      const builder = new ListBuilder(serialize, 0, this.entry)
      builder.add(this.pending)
      this.entry = this.built(builder)
      this.pending = []
      this.count('appended')
      return this.entry
    }
    this.count('refresh')
    if (this.refreshing?.generation === this.generation) return await this.refreshing.promise
    const generation = this.generation
    const refreshing = { generation, promise: this.load(serialize) }
    this.refreshing = refreshing
    try {
      const list = await refreshing.promise
      // Only a result that no invalidation overtook may be kept.
      if (generation === this.generation && this.feed.listening) this.entry = list
      return list
    } finally {
      if (this.refreshing === refreshing) this.refreshing = undefined
    }
  }

  private async load (serialize: ListSerializer<T>): Promise<CachedList> {
    const { bytes, rows } = this.lastBuilt
    const expected = bytes + (rows === 0 ? 0 : Math.ceil(this.createdSinceBuilt * bytes / rows))
    const builder = new ListBuilder(serialize, expected + (expected >> 4) + 1024)
    await this.source.listInChunks(rows => { builder.add(rows) })
    return this.built(builder)
  }

  private built (builder: ListBuilder<T>): CachedList {
    const list = builder.finish()
    this.lastBuilt = { bytes: list.body.length, rows: list.rows }
    this.createdSinceBuilt = 0
    return list
  }

  private count (source: ReadSource): void { this.reads[source]++ }
}
