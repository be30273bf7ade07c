import { createHash, type Hash } from 'node:crypto'
import { setImmediate as nextTurn } from 'node:timers/promises'
import { Counter, Gauge, type Registry } from 'prom-client'
import type { JsonSegment } from '../db/json-copy.js'
import type { Row } from '../db/table.js'
import type { ChangeFeed } from './change-feed.js'

/** Where a list is read from (a resource's db/table.ts); the lists in id order, from one snapshot. */
export interface ListSource<T extends Row> {
  listInChunks: (onChunk: (rows: T[]) => void) => Promise<void>
  /** Faster, when the source can: every row as the route's schema writes it. */
  listJson?: (segmentIds: bigint, onSegment: (segment: Segment) => void) => Promise<void>
  getMany: (ids: readonly bigint[]) => Promise<T[]>
  /** The rows with ids in [from, to). */
  getRange: (from: bigint, to: bigint) => Promise<T[]>
}

/**
 * A list as sent: its bytes and its strong ETag (the SHA-1 of the bytes). A short list is one Buffer; a long one
 * is its parts, written one after another (never joined: a change to a long list copies only what changed).
 */
export interface ListBody { body: Buffer | readonly Buffer[], length: number, etag: string }

/** The route's own serializer of an array of rows (fast-json-stringify): the cached bytes are what it writes. */
export type ListSerializer<T> = (rows: T[]) => string

/** What notify_table_insert() announces (migrations): the inserted ids, ascending, comma-separated. */
const INSERTED_IDS = /^[0-9]{1,19}(,[0-9]{1,19})*$/

/** A segment holds the rows whose id / SEGMENT_IDS is its key. */
const SEGMENT_IDS = 1024n
/** Lists up to this size are sent as one Buffer. */
export const FLAT_BYTES = 1024 * 1024
/** Bytes hashed between two turns of the event loop when a long list's tag is computed again. */
const HASH_BYTES_PER_TURN = 8 * 1024 * 1024

const OPEN = Buffer.from('[')
const COMMA = Buffer.from(',')
const CLOSE = Buffer.from(']')

type Segment = JsonSegment

/** Segments in key order; prefixes[i] has hashed every byte before segment i's (for i <= validPrefixes). */
interface Entry { segments: Segment[], prefixes: Hash[], validPrefixes: number, body: ListBody | undefined }

type ReadSource = 'cache' | 'appended' | 'refresh' | 'database'

/** A change the cache must apply before the reads that come after it: rows it was handed, or ids it was told of. */
type Change = { rows: Row[] } | { ids: bigint[] } | { keys: bigint[] }

const keyOf = (id: bigint): bigint => id / SEGMENT_IDS

/** The first index in [0, count) whose item is not below the sought one. */
function lowerBound (count: number, below: (i: number) => boolean): number {
  let low = 0
  let high = count
  while (low < high) {
    const mid = (low + high) >>> 1
    if (below(mid)) low = mid + 1
    else high = mid
  }
  return low
}

const segmentIndex = (segments: readonly Segment[], key: bigint): number =>
  lowerBound(segments.length, i => (segments[i] as Segment).key < key)
const idIndex = (ids: BigInt64Array, id: bigint): number => lowerBound(ids.length, i => (ids[i] as bigint) < id)

function segmentOf<T extends Row> (rows: T[], serialize: ListSerializer<T>): Segment {
  const bytes = Buffer.from(serialize(rows).slice(1, -1)) // the items of the array
  return { key: keyOf((rows[0] as T).id), ids: BigInt64Array.from(rows, row => row.id), bytes }
}

/** Sorted rows cut where their key changes. */
function byKey<T extends Row> (rows: T[]): T[][] {
  const groups: T[][] = []
  for (const row of rows) {
    const group = groups.at(-1)
    if (group !== undefined && keyOf((group[0] as T).id) === keyOf(row.id)) group.push(row)
    else groups.push([row])
  }
  return groups
}

/** Hashes the entry's prefixes up to its last segment (which may still grow), as a build reads. */
function hashPrefixes (entry: Entry): void {
  const { segments, prefixes } = entry
  for (let i = entry.validPrefixes; i < segments.length - 1; i++) {
    prefixes[i + 1] = (prefixes[i] as Hash).copy().update((segments[i] as Segment).bytes).update(COMMA)
  }
  entry.validPrefixes = Math.max(0, segments.length - 1)
}

/** The bytes and tag of an entry, hashing again from its first changed segment. */
async function bodyOf (entry: Entry): Promise<ListBody> {
  const segments = entry.segments
  const prefixes = entry.prefixes.slice(0, entry.validPrefixes + 1)
  let sinceTurn = 0
  for (let i = entry.validPrefixes; i < segments.length - 1; i++) {
    const bytes = (segments[i] as Segment).bytes
    prefixes[i + 1] = (prefixes[i] as Hash).copy().update(bytes).update(COMMA)
    sinceTurn += bytes.length
    if (sinceTurn >= HASH_BYTES_PER_TURN) {
      sinceTurn = 0
      await nextTurn()
    }
  }
  const last = segments.at(-1)
  const hash = (prefixes[Math.max(0, segments.length - 1)] as Hash).copy()
  if (last !== undefined) hash.update(last.bytes)
  const etag = `"${hash.update(CLOSE).digest('base64url')}"`
  const parts: Buffer[] = [OPEN]
  segments.forEach((segment, i) => { if (i > 0) parts.push(COMMA); parts.push(segment.bytes) })
  parts.push(CLOSE)
  const length = parts.reduce((sum, part) => sum + part.length, 0)
  // Segments are replaced, never changed in place: a change made meanwhile kept the old prefixes for itself.
  if (entry.segments === segments) {
    entry.prefixes = prefixes
    entry.validPrefixes = Math.max(0, segments.length - 1)
  }
  return { body: length <= FLAT_BYTES ? Buffer.concat(parts, length) : parts, length, etag }
}

export interface ListCacheOptions {
  feed: ChangeFeed
  /** The channel the table's trigger notifies. */
  channel: string
  /** Metric names start with this (`widgets` gives widgets_list_reads_total...). */
  metricPrefix: string
  registry?: Registry
}

/**
 * A resource's serialized list, kept while the change feed hears (change-feed.ts), else read from the database.
 * Held in segments by id range, so that a change copies and rehashes only from the segment it touches: rows
 * created here (`created`, before their 201s) and ids announced by others (`notified`) are added in id order,
 * whatever order they committed in, the segment read again when they fall between its rows; any other change
 * (`invalidate`) drops the list. A read waits for the changes before it; a generation counter keeps a build or
 * change that an invalidation overtook from being installed.
 */
export class ListCache<T extends Row> {
  private entry: Entry | undefined
  private generation = 0
  private building: { generation: number, promise: Promise<Entry> } | undefined
  private bodying: { entry: Entry, segments: Segment[], promise: Promise<ListBody> } | undefined
  private queue: Change[] = []
  private announced = 0
  private applied = 0
  private working: Promise<void> | undefined
  /** Notifications whose rows the list already had (the echoes of this instance's own creates). */
  private echoes = 0
  /** This instance's creates under way: a notification can arrive before the create's own answer does. */
  private readonly writes = new Set<Promise<unknown>>()
  private serialize: ListSerializer<T> | undefined
  private readonly feed: ChangeFeed
  private readonly reads: Record<ReadSource, number> = { cache: 0, appended: 0, refresh: 0, database: 0 }

  constructor (private readonly source: ListSource<T>, options: ListCacheOptions) {
    this.feed = options.feed
    options.feed.subscribe(options.channel, {
      notified: payload => { this.notified(payload) },
      invalidate: () => { this.invalidate() }
    })
    if (options.registry !== undefined) registerMetrics(options, this.reads, () => this.echoes)
  }

  get listening (): boolean { return this.feed.listening }

  invalidate (): void {
    this.generation++
    this.entry = undefined
    this.queue = []
    this.applied = this.announced
  }

  /** Rows this instance committed; called before their 201s are sent, so the next read here lists them. */
  created (rows: readonly T[]): void {
    if (rows.length === 0) return
    const sorted = [...rows].sort((a, b) => a.id < b.id ? -1 : 1)
    // Added at once (a notification of these rows may be waiting for them: their echo); during a build, after it.
    if (this.entry === undefined || this.serialize === undefined) {
      this.announce({ rows: sorted })
      return
    }
    const keys = this.add(sorted)
    if (keys.length > 0) this.announce({ keys })
  }

  /** A notification on the table's channel: ids an insert committed (added before the next read), or else a drop. */
  private notified (payload: string): void {
    if (INSERTED_IDS.test(payload)) this.announce({ ids: payload.split(',').map(BigInt) })
    else this.invalidate()
  }

  /** Runs an own create: rows announced meanwhile are looked for among its rows before being read from the database. */
  async writing<R> (write: Promise<R>): Promise<R> {
    this.writes.add(write)
    return await write.finally(() => this.writes.delete(write))
  }

  /** The list; `serialize` writes an array of rows as the route's schema does. */
  async read (serialize: ListSerializer<T>): Promise<ListBody> {
    this.serialize = serialize
    if (!this.feed.listening) {
      this.reads.database++
      return await bodyOf(await this.snapshot(serialize))
    }
    let source: ReadSource = 'cache'
    let entry = this.entry
    if (entry === undefined) {
      source = 'refresh'
      // From a snapshot taken after this read began: served even if a change overtook it (then not kept).
      entry = await this.build(serialize)
    } else {
      const until = this.announced
      while (this.applied < until && this.working !== undefined) await this.working
      entry = this.entry
      // Dropped meanwhile (a change the cache could not apply, or the feed went deaf): the database answers this one.
      if (entry === undefined) {
        this.reads.database++
        return await bodyOf(await this.snapshot(serialize))
      }
    }
    if (entry.body !== undefined) {
      this.reads[source]++
      return entry.body
    }
    this.reads[source === 'cache' ? 'appended' : source]++
    return await this.bodyOf(entry)
  }

  private async snapshot (serialize: ListSerializer<T>): Promise<Entry> {
    const prefixes = [createHash('sha1').update(OPEN)]
    const entry: Entry = { segments: [], prefixes, validPrefixes: 0, body: undefined }
    const { segments } = entry
    const add = (segment: Segment): void => {
      const last = segments.at(-1)
      if (last?.key === segment.key) segments[segments.length - 1] = joined(last, segment) // one key, two chunks
      else segments.push(segment)
      hashPrefixes(entry)
    }
    if (this.source.listJson !== undefined) await this.source.listJson(SEGMENT_IDS, add)
    else await this.source.listInChunks(rows => { for (const group of byKey(rows)) add(segmentOf(group, serialize)) })
    return entry
  }

  /** One build at a time, shared; changes announced while it read are applied after it (none added twice). */
  private async build (serialize: ListSerializer<T>): Promise<Entry> {
    if (this.building?.generation !== this.generation) {
      const generation = this.generation
      const promise = (async () => {
        const entry = await this.snapshot(serialize)
        if (generation === this.generation && this.feed.listening) {
          this.entry = entry
          this.work()
        }
        return entry
      })()
      const building = { generation, promise }
      this.building = building
      promise.then(() => {}, () => { if (generation === this.generation) this.invalidate() })
        .finally(() => { if (this.building === building) this.building = undefined }).catch(() => {})
    }
    return await this.building.promise
  }

  /** The entry's body, computed once per version and shared. */
  private async bodyOf (entry: Entry): Promise<ListBody> {
    if (this.bodying?.entry !== entry || this.bodying.segments !== entry.segments) {
      const segments = entry.segments
      const promise = bodyOf(entry).then(body => {
        // A change that came meanwhile made another version: this one is served, not kept.
        if (entry.segments === segments) entry.body = body
        return body
      })
      this.bodying = { entry, segments, promise }
    }
    return await this.bodying.promise
  }

  private announce (change: Change): void {
    if (this.entry === undefined && this.building === undefined) return // nothing cached: the next build reads it
    this.queue.push(change)
    this.announced++
    this.work()
  }

  /** Applies the queued changes in order, one at a time. */
  private work (): void {
    if (this.working !== undefined || this.entry === undefined || this.queue.length === 0) return
    const generation = this.generation
    this.working = (async () => {
      while (this.queue.length > 0 && generation === this.generation) {
        const change = this.queue.shift() as Change
        try {
          await this.apply(change, generation)
          if (generation === this.generation) this.applied++
        } catch {
          // The database could not say what changed: nobody may be served a list without it.
          if (generation === this.generation) this.invalidate()
        }
      }
    })().finally(() => {
      this.working = undefined
      this.work()
    })
  }

  private async apply (change: Change, generation: number): Promise<void> {
    let rows: T[] | undefined = []
    if ('rows' in change) rows = change.rows as T[]
    else if ('ids' in change) rows = await this.unheld(change.ids, generation)
    const keys = 'keys' in change ? change.keys : rows === undefined ? [] : this.add(rows)
    for (const key of keys) {
      const range = await this.source.getRange(key * SEGMENT_IDS, (key + 1n) * SEGMENT_IDS)
      if (generation !== this.generation) return
      this.replace(key, range)
    }
  }

  /** The rows of announced ids the list lacks, read by id; undefined if it has them all (own creates' echoes). */
  private async unheld (ids: bigint[], generation: number): Promise<T[] | undefined> {
    if (this.writes.size > 0 && ids.some(id => !this.has(id))) {
      await Promise.allSettled([...this.writes])
      if (generation !== this.generation) return undefined
    }
    const missing = ids.filter(id => !this.has(id))
    if (missing.length === 0) {
      this.echoes++
      return undefined
    }
    const rows = await this.source.getMany(missing)
    if (generation !== this.generation) return undefined
    // Announced, committed, and gone already: a delete is on its way; until then nothing is certain.
    if (rows.length !== missing.length) throw new Error('an announced row no longer exists')
    return rows
  }

  private has (id: bigint): boolean {
    const segments = this.entry?.segments ?? []
    const segment = segments[segmentIndex(segments, keyOf(id))]
    return segment !== undefined && segment.key === keyOf(id) && segment.ids[idIndex(segment.ids, id)] === id
  }

  /** Adds rows (sorted) to their segments; returns the keys of segments they fall inside of, to be read again. */
  private add (rows: T[]): bigint[] {
    const entry = this.entry as Entry
    const serialize = this.serialize as ListSerializer<T>
    const reread: bigint[] = []
    const segments = [...entry.segments]
    let changedFrom = segments.length
    for (const group of byKey(rows)) {
      const key = keyOf((group[0] as T).id)
      const at = segmentIndex(segments, key)
      const segment = segments[at]
      if (segment === undefined || segment.key !== key) {
        segments.splice(at, 0, segmentOf(group, serialize))
      } else {
        const fresh = group.filter(row => segment.ids[idIndex(segment.ids, row.id)] !== row.id)
        if (fresh.length === 0) continue
        const first = segment.ids[0] as bigint
        const last = segment.ids[segment.ids.length - 1] as bigint
        const added = segmentOf(fresh, serialize)
        if ((fresh[0] as T).id > last) segments[at] = joined(segment, added)
        else if ((fresh[fresh.length - 1] as T).id < first) segments[at] = joined(added, segment)
        else reread.push(key)
      }
      changedFrom = Math.min(changedFrom, at)
    }
    this.install(segments, changedFrom)
    return reread
  }

  /** Puts the rows read for a key in place of its segment. */
  private replace (key: bigint, rows: T[]): void {
    const entry = this.entry as Entry
    const segments = [...entry.segments]
    const at = segmentIndex(segments, key)
    const replacement = rows.length === 0 ? [] : [segmentOf(rows, this.serialize as ListSerializer<T>)]
    segments.splice(at, segments[at]?.key === key ? 1 : 0, ...replacement)
    this.install(segments, at)
  }

  private install (segments: Segment[], changedFrom: number): void {
    const entry = this.entry as Entry
    if (changedFrom >= segments.length && segments.length === entry.segments.length) return
    entry.segments = segments
    entry.validPrefixes = Math.min(entry.validPrefixes, changedFrom)
    entry.body = undefined
  }
}

function joined (a: Segment, b: Segment): Segment {
  const ids = new BigInt64Array(a.ids.length + b.ids.length)
  ids.set(a.ids)
  ids.set(b.ids, a.ids.length)
  return { key: a.key, ids, bytes: Buffer.concat([a.bytes, COMMA, b.bytes]) }
}

function registerMetrics (options: ListCacheOptions, reads: Record<ReadSource, number>, echoes: () => number): void {
  const registers = [options.registry as Registry]
  const prefix = options.metricPrefix
  const feed = options.feed
  /* eslint-disable no-new */
  new Counter({
    name: `${prefix}_list_reads_total`,
    help: 'List reads by source: cache, appended (the cache plus rows added since), refresh (built from the ' +
      'database, one build shared by waiting readers) or database (change feed down or deaf)',
    labelNames: ['source'],
    registers,
    collect () { this.reset(); for (const [source, count] of Object.entries(reads)) this.labels(source).inc(count) }
  })
  const gauge = (name: string, help: string, value: () => number): void => {
    new Gauge({ name: `${prefix}_change_feed_${name}`, help, registers, collect () { this.set(value()) } })
  }
  gauge('listening', '1 while the change feed hears notifications (its last probe was echoed) and the list cache ' +
    'may be used; 0: the list is read from the database', () => feed.listening ? 1 : 0)
  gauge('drops', 'Times the change feed connection was lost, could not be made, or was found deaf', () => feed.drops)
  gauge('probes_missed', 'Probe notifications the change feed sent through the pool and did not hear in time',
    () => feed.probesMissed)
  gauge('echo_seconds', 'Time from sending the change feed\'s last heard probe notification to its echo',
    () => feed.lastEchoMs === undefined ? NaN : feed.lastEchoMs / 1000)
  gauge('own_echoes', 'Notifications that announced only rows the cached list already had (this instance\'s own ' +
    'creates)', echoes)
  new Gauge({
    name: `${prefix}_change_feed_connection_info`,
    help: 'The setting whose connection the change feed listens on (DATABASE_DIRECT_URL or DATABASE_URL)',
    labelNames: ['connection'],
    registers,
    collect () { this.labels(feed.connectionName).set(1) }
  })
  /* eslint-enable no-new */
}
