import { createHash, type Hash } from 'node:crypto'
import { setImmediate as nextTurn } from 'node:timers/promises'
import { Counter, type Registry } from 'prom-client'
import type { JsonSegment as Segment } from '../db/json-copy.js'
import type { Row, Table } from '../db/table.js'
import type { ChangeFeed } from './change-feed.js'

/** Where a list is read from: a resource's table, whose triggers notify `<name>_changed` (migrations). */
export type ListSource<T extends Row> = Pick<Table<object, T>, 'name' | 'listJson' | 'getMany' | 'getRange'>

/** A list as sent, with its strong ETag (the bytes' SHA-1); a long one stays in parts: a change copies only those. */
export interface ListBody { body: Buffer | readonly Buffer[], length: number, etag: string }

/** The route's own serializer of an array of rows (fast-json-stringify): the cached bytes are what it writes. */
export type ListSerializer<T> = (rows: T[]) => string

/** What notify_table_insert() announces (migrations): the inserted ids, ascending, comma-separated. */
const INSERTED_IDS = /^[0-9]{1,19}(,[0-9]{1,19})*$/

const SEGMENT_IDS = 4096n // a segment holds the rows whose id / SEGMENT_IDS is its key
const FLAT_BYTES = 1024 * 1024
const HASH_BYTES_PER_TURN = 8 * 1024 * 1024 // then the event loop takes a turn, when a long list is hashed again

const OPEN = Buffer.from('[')
const COMMA = Buffer.from(',')
const CLOSE = Buffer.from(']')

/** Segments in key order; prefixes[i] has hashed every byte before segment i's (for i <= validPrefixes). */
interface Entry {
  segments: Segment[]
  prefixes: Hash[]
  validPrefixes: number
  body?: ListBody
  pending?: Promise<ListBody> // the body while it is made, shared by the reads meanwhile
}

const keyOf = (id: bigint): bigint => id / SEGMENT_IDS

function lowerBound<I> (items: ArrayLike<I>, below: (item: I) => boolean): number {
  let low = 0
  let high = items.length
  while (low < high) {
    const mid = (low + high) >>> 1
    if (below(items[mid] as I)) low = mid + 1
    else high = mid
  }
  return low
}

const segmentIndex = (segments: readonly Segment[], key: bigint): number => lowerBound(segments, s => s.key < key)
const holds = (segment: Segment, id: bigint): boolean => segment.ids[lowerBound(segment.ids, item => item < id)] === id

function segmentOf<T extends Row> (rows: T[], serialize: ListSerializer<T>): Segment {
  const bytes = Buffer.from(serialize(rows).slice(1, -1)) // the items of the array
  return { key: keyOf((rows[0] as T).id), ids: BigInt64Array.from(rows, row => row.id), bytes }
}

const joined = (a: Segment, b: Segment): Segment =>
  ({ key: a.key, ids: BigInt64Array.of(...a.ids, ...b.ids), bytes: Buffer.concat([a.bytes, COMMA, b.bytes]) })

/** Hashes prefixes from `from` on, to the last segment (it may still grow) or a few MB; returns where it stopped. */
function hashPrefixes (prefixes: Hash[], segments: readonly Segment[], from: number): number {
  let i = from
  for (let hashed = 0; i < segments.length - 1 && hashed < HASH_BYTES_PER_TURN; i++) {
    const { bytes } = segments[i] as Segment
    prefixes[i + 1] = (prefixes[i] as Hash).copy().update(bytes).update(COMMA)
    hashed += bytes.length
  }
  return i
}

export function listBody (parts: Buffer[], etag: string): ListBody {
  const length = parts.reduce((sum, part) => sum + part.length, 0)
  return { body: length <= FLAT_BYTES ? Buffer.concat(parts, length) : parts, length, etag }
}

/** The bytes and tag of an entry, hashing again from its first changed segment. */
async function bodyOf (entry: Entry): Promise<ListBody> {
  const segments = entry.segments
  const prefixes = entry.prefixes.slice(0, entry.validPrefixes + 1)
  const last = Math.max(0, segments.length - 1)
  let hashed = entry.validPrefixes
  while ((hashed = hashPrefixes(prefixes, segments, hashed)) < last) await nextTurn()
  const hash = (prefixes[last] as Hash).copy().update(segments[last]?.bytes ?? '').update(CLOSE)
  const parts = [OPEN, ...segments.flatMap(({ bytes }, i) => i === 0 ? [bytes] : [COMMA, bytes]), CLOSE]
  const body = listBody(parts, `"${hash.digest('base64url')}"`)
  // Segments are replaced, never changed in place: a change made meanwhile made another version, served, not kept.
  if (entry.segments === segments) {
    entry.prefixes = prefixes
    entry.validPrefixes = last
    entry.body = body
  }
  return body
}

/**
 * A resource's serialized list, kept while the change feed hears, else read from the database. Held in segments by
 * id range, so that a change copies and rehashes only from the segment it touches: rows created here and ids
 * announced by others are added in id order, the segment read again when they fall between its rows; any other
 * change drops the list. A generation counter keeps a build or change that a drop overtook from being installed.
 */
export class ListCache<T extends Row> {
  private entry: Entry | undefined
  private generation = 0
  private building: { generation: number, promise: Promise<Entry> } | undefined
  /** The changes announced so far, applied one after another: a read waits for those before it. */
  private changes: Promise<void> = Promise.resolve()
  private unapplied = 0 // a read with none to wait for answers without a turn of the microtask queue
  /** Notifications whose rows the list already had (the echoes of this instance's own creates). */
  private echoes = 0
  /** This instance's creates under way: a notification can arrive before the create's own answer does. */
  private readonly writes = new Set<Promise<unknown>>()
  private serialize!: ListSerializer<T> // the last read's: a read comes before any entry
  private readonly reads = { cache: 0, appended: 0, refresh: 0, database: 0 }

  constructor (private readonly source: ListSource<T>, private readonly feed: ChangeFeed, registry?: Registry) {
    feed.subscribe(`${source.name}_changed`, {
      notified: payload => {
        if (!INSERTED_IDS.test(payload)) this.invalidate()
        else this.announce(async generation => { await this.addAnnounced(payload.split(',').map(BigInt), generation) })
      },
      invalidate: () => { this.invalidate() }
    })
    if (registry !== undefined) registerMetrics(source.name, registry, this.reads, () => this.echoes)
  }

  get listening (): boolean { return this.feed.listening }

  invalidate (): void {
    this.generation++
    this.entry = undefined
  }

  /** Rows this instance committed; called before their 201s are sent, so the next read here lists them. */
  created (rows: readonly T[]): void {
    const sorted = [...rows].sort((a, b) => a.id < b.id ? -1 : 1)
    // Added at once (a notification of these rows may be waiting for them: their echo); during a build, after it.
    const keys = this.entry === undefined ? undefined : this.add(sorted)
    if (keys === undefined) this.announce(async generation => { await this.reread(this.add(sorted), generation) })
    else if (keys.length > 0) this.announce(async generation => { await this.reread(keys, generation) })
  }

  /** Runs an own create: rows announced meanwhile are looked for among its rows before being read from the database. */
  async writing<R> (write: Promise<R>): Promise<R> {
    this.writes.add(write)
    return await write.finally(() => this.writes.delete(write))
  }

  async read (serialize: ListSerializer<T>): Promise<ListBody> {
    this.serialize = serialize
    const source = this.entry === undefined ? 'refresh' : 'cache'
    let entry: Entry | undefined
    if (this.feed.listening) {
      // A refresh serves a snapshot taken after this read began, even if a change overtook it (then not kept).
      if (source === 'refresh') entry = await this.build()
      else entry = this.unapplied === 0 ? this.entry : await this.changes.then(() => this.entry)
    }
    // Deaf, or dropped meanwhile (a change the cache could not apply): the database answers this one.
    if (entry === undefined) {
      this.reads.database++
      return await bodyOf(await this.snapshot())
    }
    this.reads[source === 'cache' && entry.body === undefined ? 'appended' : source]++
    if (entry.body !== undefined) return entry.body
    entry.pending ??= bodyOf(entry)
    return await entry.pending
  }

  private async snapshot (): Promise<Entry> {
    const entry: Entry = { segments: [], prefixes: [createHash('sha1').update(OPEN)], validPrefixes: 0 }
    await this.source.listJson(SEGMENT_IDS, segment => {
      entry.segments.push(segment)
      entry.validPrefixes = hashPrefixes(entry.prefixes, entry.segments, entry.validPrefixes) // as the build reads
    })
    return entry
  }

  /** One build at a time, shared; changes announced while it read are applied after it (none added twice). */
  private async build (): Promise<Entry> {
    if (this.building?.generation !== this.generation) {
      const generation = this.generation
      const promise = this.snapshot().then(entry => {
        if (generation === this.generation && this.feed.listening) this.entry = entry
        return entry
      })
      const building = { generation, promise }
      this.building = building
      promise.catch(() => { if (generation === this.generation) this.invalidate() })
        .finally(() => { if (this.building === building) this.building = undefined })
    }
    return await this.building.promise
  }

  /** Applies a change after those announced before it (and after the build under way, if any). */
  private announce (change: (generation: number) => Promise<void>): void {
    const building = this.building?.promise
    if (this.entry === undefined && building === undefined) return // nothing cached: the next build reads it
    const generation = this.generation
    this.unapplied++
    this.changes = this.changes.then(async () => {
      await building
      if (generation === this.generation && this.entry !== undefined) await change(generation)
    }).catch(() => {
      // The database could not say what changed: nobody may be served a list without it.
      if (generation === this.generation) this.invalidate()
    }).finally(() => { this.unapplied-- })
  }

  private async reread (keys: bigint[], generation: number): Promise<void> {
    for (const key of keys) {
      const rows = await this.source.getRange(key * SEGMENT_IDS, (key + 1n) * SEGMENT_IDS)
      if (generation !== this.generation) return
      const segments = [...(this.entry as Entry).segments]
      const at = segmentIndex(segments, key)
      const replacement = rows.length === 0 ? [] : [segmentOf(rows, this.serialize)]
      segments.splice(at, segments[at]?.key === key ? 1 : 0, ...replacement)
      this.install(segments, at)
    }
  }

  /** Adds the rows of announced ids that the list lacks (none: the echo of an own create), read by id. */
  private async addAnnounced (ids: bigint[], generation: number): Promise<void> {
    if (this.writes.size > 0 && ids.some(id => !this.has(id))) {
      await Promise.allSettled([...this.writes])
      if (generation !== this.generation) return
    }
    const missing = ids.filter(id => !this.has(id))
    if (missing.length === 0) {
      this.echoes++
      return
    }
    const rows = await this.source.getMany(missing)
    if (generation !== this.generation) return
    // Announced, committed, and gone already: a delete is on its way; until then nothing is certain.
    if (rows.length !== missing.length) throw new Error('an announced row no longer exists')
    await this.reread(this.add(rows), generation)
  }

  private has (id: bigint): boolean {
    const segments = this.entry?.segments ?? []
    const segment = segments[segmentIndex(segments, keyOf(id))]
    return segment?.key === keyOf(id) && holds(segment, id)
  }

  /** Adds rows (sorted) to their segments; returns the keys of segments they fall inside of, to be read again. */
  private add (rows: T[]): bigint[] {
    const segments = [...(this.entry as Entry).segments]
    const reread: bigint[] = []
    let changedFrom = segments.length
    for (let from = 0, to = 0; from < rows.length; from = to) {
      const key = keyOf((rows[from] as T).id)
      while (to < rows.length && keyOf((rows[to] as T).id) === key) to++
      const group = rows.slice(from, to)
      const at = segmentIndex(segments, key)
      const segment = segments[at]
      if (segment?.key !== key) {
        segments.splice(at, 0, segmentOf(group, this.serialize))
      } else {
        const fresh = group.filter(row => !holds(segment, row.id))
        if (fresh.length === 0) continue
        const added = segmentOf(fresh, this.serialize)
        if ((fresh[0] as T).id > (segment.ids.at(-1) as bigint)) segments[at] = joined(segment, added)
        else if ((fresh.at(-1) as T).id < (segment.ids[0] as bigint)) segments[at] = joined(added, segment)
        else reread.push(key)
      }
      changedFrom = Math.min(changedFrom, at)
    }
    this.install(segments, changedFrom)
    return reread
  }

  private install (segments: Segment[], changedFrom: number): void {
    const entry = this.entry as Entry
    if (changedFrom >= segments.length && segments.length === entry.segments.length) return
    entry.segments = segments
    entry.validPrefixes = Math.min(entry.validPrefixes, changedFrom)
    entry.body = entry.pending = undefined
  }
}

function registerMetrics (prefix: string, registry: Registry, reads: Record<string, number>, echoes: () => number):
void {
  const registers = [registry]
  /* eslint-disable no-new */
  new Counter({
    name: `${prefix}_list_reads_total`,
    help: 'List reads by source: cache, appended (the cache plus rows added since), refresh (built from the ' +
      'database, one build shared by waiting readers) or database (change feed down or deaf)',
    labelNames: ['source'],
    registers,
    collect () { this.reset(); for (const [source, count] of Object.entries(reads)) this.labels(source).inc(count) }
  })
  new Counter({
    name: `${prefix}_list_own_echoes_total`,
    help: 'Notifications that announced only rows the cached list already had (this instance\'s own creates)',
    registers,
    collect () {
      this.reset()
      this.inc(echoes())
    }
  })
  /* eslint-enable no-new */
}
