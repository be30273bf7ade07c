import { createHash } from 'node:crypto'
import type { JsonSegment } from '../db/json-copy.js'

/** Ids per segment: a segment holds the rows whose id / SEGMENT_IDS is its key (a power of two: json-copy.ts). */
export const SEGMENT_IDS = 4096

/** Up to this size a list is sent as one Buffer; a longer one stays in its parts, never joined into one copy. */
const FLAT_BYTES = 1024 * 1024

const OPEN = Buffer.from('[')
const COMMA = Buffer.from(',')
const CLOSE = Buffer.from(']')

/** A list as sent, with its strong ETag. */
export interface ListBody { body: Buffer | readonly Buffer[], length: number, etag: string }

/** One row's JSON object, as the list's serializer writes it. */
export interface RowJson { id: bigint, json: Buffer }

/** What a change did. */
export interface Changed { added: number, replaced: number, removed: number }

/** Up to `limit` rows after an id: the JSON array, the last id in it, and whether rows follow it. */
export interface Page { body: Buffer, lastId: bigint | undefined, more: boolean }

interface Segment extends JsonSegment {
  /** SHA-1 of `bytes`, made when first needed. */
  digest?: Buffer
}

const keyOf = (id: bigint): bigint => id / BigInt(SEGMENT_IDS)

/** The first index whose item is not `below` (items ordered so that `below` holds for a prefix). */
function lowerBound<I> (items: ArrayLike<I>, below: (item: I) => boolean, from = 0): number {
  let low = from
  let high = items.length
  while (low < high) {
    const mid = (low + high) >>> 1
    if (below(items[mid] as I)) low = mid + 1
    else high = mid
  }
  return low
}

const startOf = (segment: Segment, row: number): number => row === 0 ? 0 : (segment.ends[row - 1] as number) + 1
const lastId = (segment: Segment): bigint => segment.ids[segment.ids.length - 1] as bigint

export function listBody (parts: Buffer[], etag: string): ListBody {
  const length = parts.reduce((sum, part) => sum + part.length, 0)
  return { body: length <= FLAT_BYTES ? Buffer.concat(parts, length) : parts, length, etag }
}

/** A segment made of runs of whole rows, joined by commas, into arrays sized for the rows it may hold. */
class SegmentWriter {
  private readonly parts: Buffer[] = []
  private readonly ids: BigInt64Array
  private readonly ends: Uint32Array
  private count = 0
  private length = 0

  constructor (private readonly key: bigint, capacity: number) {
    this.ids = new BigInt64Array(capacity)
    this.ends = new Uint32Array(capacity)
  }

  /** Rows [from, to) of a segment, copied as one run. */
  rows (segment: Segment, from: number, to: number): void {
    if (from >= to) return
    const start = startOf(segment, from)
    this.separate()
    this.ids.set(segment.ids.subarray(from, to), this.count)
    const shift = this.length - start
    for (let row = from; row < to; row++) this.ends[this.count++] = (segment.ends[row] as number) + shift
    const run = segment.bytes.subarray(start, segment.ends[to - 1])
    this.parts.push(run)
    this.length += run.length
  }

  row ({ id, json }: RowJson): void {
    this.separate()
    this.parts.push(json)
    this.length += json.length
    this.ids[this.count] = id
    this.ends[this.count++] = this.length
  }

  segment (): Segment | undefined {
    if (this.count === 0) return undefined
    return {
      key: this.key,
      ids: this.ids.subarray(0, this.count),
      ends: this.ends.subarray(0, this.count),
      bytes: Buffer.concat(this.parts, this.length)
    }
  }

  private separate (): void {
    if (this.length === 0) return
    this.parts.push(COMMA)
    this.length += COMMA.length
  }
}

/**
 * The rows of a list in id order, as the JSON the list sends, in segments by id range: a change copies and hashes
 * only the segments it touches, once per read however many changes came before it (a change waits as pending until
 * a body or page is made). Synchronous and pure: the coordination around it is list-cache.ts.
 *
 * The strong ETag is the SHA-1 of the segments' SHA-1s: the segments are a function of the rows' ids, so equal
 * bytes give equal tags on every instance, and a change rehashes one segment, not the whole list.
 */
export class SegmentedList {
  private segments: Segment[] = []
  /** Changes not merged into their segments yet, by segment key: a row's JSON, or undefined when it is removed. */
  private readonly pending = new Map<bigint, Map<bigint, Buffer | undefined>>()
  private made: ListBody | undefined

  /** A segment read in key order, after every segment before it (a build); its digest is made now, bit by bit. */
  append (segment: JsonSegment): void {
    this.segments.push({ ...segment, digest: sha1(segment.bytes) })
    this.made = undefined
  }

  /** Whether the body of the list as it is now was already made (a read answered since the last change). */
  get unchanged (): boolean {
    return this.made !== undefined
  }

  has (id: bigint): boolean {
    return this.rowBytes(id) !== undefined
  }

  /**
   * Puts rows (replacing a row of the same id) and removes ids; a removal wins, and of two puts of one id the later.
   * What changes nothing (an absent id, the same bytes again) is skipped: answers the rows added, replaced and removed.
   */
  apply (puts: readonly RowJson[], removes: readonly bigint[] = []): Changed {
    const wanted = new Map<bigint, Buffer | undefined>(puts.map(row => [row.id, row.json]))
    for (const id of removes) wanted.set(id, undefined)
    const changed = { added: 0, replaced: 0, removed: 0 }
    for (const [id, json] of wanted) {
      const present = this.rowBytes(id)
      if (json === undefined && present === undefined) continue
      if (json !== undefined && present?.equals(json) === true) continue
      if (json === undefined) changed.removed++
      else if (present === undefined) changed.added++
      else changed.replaced++
      const key = keyOf(id)
      const waiting = this.pending.get(key) ?? new Map<bigint, Buffer | undefined>()
      waiting.set(id, json)
      this.pending.set(key, waiting)
      this.made = undefined
    }
    return changed
  }

  /** The whole list as sent, made once per version. */
  body (): ListBody {
    if (this.made !== undefined) return this.made
    this.settle()
    const tag = createHash('sha1')
    const parts: Buffer[] = [OPEN]
    for (const segment of this.segments) {
      segment.digest ??= sha1(segment.bytes)
      tag.update(segment.digest)
      if (parts.length > 1) parts.push(COMMA)
      parts.push(segment.bytes)
    }
    parts.push(CLOSE)
    this.made = listBody(parts, `"${tag.digest('base64url')}"`)
    return this.made
  }

  /** Up to `limit` rows with ids above `after`: a run of bytes from each segment it spans. */
  page (after: bigint, limit: number): Page {
    this.settle()
    const parts: Buffer[] = [OPEN]
    let at = lowerBound(this.segments, segment => lastId(segment) <= after)
    let row = at < this.segments.length ? lowerBound((this.segments[at] as Segment).ids, id => id <= after) : 0
    let taken = 0
    let last: bigint | undefined
    while (taken < limit && at < this.segments.length) {
      const segment = this.segments[at] as Segment
      const to = Math.min(segment.ids.length, row + limit - taken)
      if (parts.length > 1) parts.push(COMMA)
      parts.push(segment.bytes.subarray(startOf(segment, row), segment.ends[to - 1]))
      taken += to - row
      last = segment.ids[to - 1]
      row = to
      if (row === segment.ids.length) {
        at++
        row = 0
      }
    }
    parts.push(CLOSE)
    return { body: Buffer.concat(parts), lastId: last, more: at < this.segments.length }
  }

  /** Merges the pending changes into their segments, each touched segment once. */
  private settle (): void {
    const keys = [...this.pending.keys()].sort((a, b) => a < b ? -1 : 1)
    for (const key of keys) {
      const changes = [...this.pending.get(key) ?? []].map(([id, json]) => ({ id, json }))
        .sort((a, b) => a.id < b.id ? -1 : 1)
      const at = this.segmentIndex(key)
      const old = this.segments[at]?.key === key ? this.segments[at] : undefined
      const changed = merged(key, old, changes)
      const replacement = changed === undefined ? [] : [changed]
      this.segments.splice(at, old === undefined ? 0 : 1, ...replacement)
    }
    this.pending.clear()
  }

  /** The JSON of the row with this id, or undefined when the list has none. */
  private rowBytes (id: bigint): Buffer | undefined {
    const key = keyOf(id)
    const waiting = this.pending.get(key)
    if (waiting?.has(id) === true) return waiting.get(id)
    const segment = this.segments[this.segmentIndex(key)]
    if (segment?.key !== key) return undefined
    const row = lowerBound(segment.ids, item => item < id)
    return segment.ids[row] === id ? segment.bytes.subarray(startOf(segment, row), segment.ends[row]) : undefined
  }

  private segmentIndex (key: bigint): number {
    return lowerBound(this.segments, segment => segment.key < key)
  }
}

/** A segment with changes (sorted by id, all of its key; json undefined: removed) applied; undefined when empty. */
function merged (key: bigint, old: Segment | undefined,
  changes: ReadonlyArray<{ id: bigint, json: Buffer | undefined }>): Segment | undefined {
  const writer = new SegmentWriter(key, (old?.ids.length ?? 0) + changes.length)
  let row = 0
  for (const change of changes) {
    if (old !== undefined) {
      const at = lowerBound(old.ids, id => id < change.id, row)
      writer.rows(old, row, at)
      row = old.ids[at] === change.id ? at + 1 : at
    }
    if (change.json !== undefined) writer.row({ id: change.id, json: change.json })
  }
  if (old !== undefined) writer.rows(old, row, old.ids.length)
  return writer.segment()
}

const sha1 = (bytes: Buffer): Buffer => createHash('sha1').update(bytes).digest()
