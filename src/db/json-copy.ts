import type pg from 'pg'
import { setImmediate as nextTurn } from 'node:timers/promises'
import { to as copyTo } from 'pg-copy-streams'

/**
 * Rows whose ids share a key (id / segment size), as JSON: ids ascending, their objects joined by commas;
 * `ends[i]` is where row i's object ends in `bytes` (a comma or the end follows).
 */
export interface JsonSegment { key: bigint, ids: BigInt64Array, ends: Uint32Array, bytes: Buffer }

const QUOTE = 0x22
const BACKSLASH = 0x5c
const FIRST_PRINTABLE = 0x20

// What JSON.stringify (and fast-json-stringify) writes for the bytes it escapes: `"`, `\` and the C0 controls.
const ESCAPED = Array.from({ length: 256 }, (_, byte) =>
  byte < FIRST_PRINTABLE || byte === QUOTE || byte === BACKSLASH
    ? JSON.stringify(String.fromCharCode(byte)).slice(1, -1)
    : undefined)

/** Binary COPY's signature, flags field and empty header extension, before the first row. */
const HEADER_BYTES = 19
/** Rows arrive faster than they are written: the event loop gets a turn at least this often. */
const YIELD_AFTER_MS = 5
const OUT_INITIAL_BYTES = 1 << 20
/** JSON escaping makes at most six bytes of one (\u001f). */
const MAX_ESCAPE_GROWTH = 6
const ROW_OVERHEAD_BYTES = 64
const MEMBER_OVERHEAD_BYTES = 32

/**
 * Writes rows as the route's serializer does (the schema's member order, NULL members left out, int8 as a bare
 * number) from the bytes of `COPY (SELECT id, <columns cast to their types>) TO STDOUT (FORMAT binary)`: no row
 * objects, no strings. PostgreSQL sends valid UTF-8, so JSON.stringify's escaping is per byte.
 */
export class JsonCopyWriter {
  private readonly members: Array<{ prefix: string, type: string }>
  private out = Buffer.allocUnsafe(OUT_INITIAL_BYTES)
  private outView = viewOf(this.out)
  private input: { data: Buffer, view: DataView } | undefined
  private length = 0
  private readonly ids: BigInt64Array
  private readonly idBytes: Uint8Array
  private readonly ends: Uint32Array
  private count = 0
  private key = -1
  copied = 0 // rows in the last copy

  /** `size` ids per segment: a power of two, so that a key is read off the id's two 32-bit halves exactly. */
  constructor (columns: Record<string, string>, private readonly size: number,
    private readonly onSegment: (segment: JsonSegment) => void) {
    if (!Number.isInteger(Math.log2(size)) || size > 2 ** 32) throw new Error('a segment size is a power of two')
    this.members = Object.entries(columns).map(([name, type]) => ({ prefix: `,"${name}":`, type }))
    this.ids = new BigInt64Array(size)
    this.idBytes = new Uint8Array(this.ids.buffer)
    this.ends = new Uint32Array(size)
  }

  /** The id of the last row written (the open segment always holds it). */
  get lastId (): bigint {
    return this.ids[this.count - 1] as bigint
  }

  async copy (client: pg.ClientBase, sql: string): Promise<void> {
    this.copied = 0
    let skip = HEADER_BYTES
    let rest: Buffer | undefined // a row begun in the chunks before
    let turn = performance.now()
    for await (const received of client.query(copyTo(sql)) as AsyncIterable<Buffer>) {
      // One turn of the event loop can carry many chunks (libuv reads a socket up to 32 times in a row): unyielding,
      // a turn took 40-60 ms while a liveness probe waited.
      if (performance.now() - turn > YIELD_AFTER_MS) {
        await nextTurn()
        turn = performance.now()
      }
      const chunk = received.subarray(skip)
      skip = Math.max(0, skip - received.length)
      const data = rest === undefined ? chunk : Buffer.concat([rest, chunk])
      let at = 0
      for (let end = this.rowEnd(data, at); end > 0; end = this.rowEnd(data, at)) {
        this.row(data, at + 2, end - at)
        at = end
      }
      rest = at < data.length ? data.subarray(at) : undefined
    }
  }

  /** Hands over the open segment. */
  finish (): void {
    if (this.count === 0) return
    const bytes = Buffer.from(this.out.subarray(0, this.length - 1)) // less its trailing comma
    const { count } = this
    this.onSegment({ key: BigInt(this.key), ids: this.ids.slice(0, count), ends: this.ends.slice(0, count), bytes })
    this.count = 0
    this.length = 0
  }

  /** Where the row at `at` ends, or 0 while it is incomplete (or the trailer). */
  private rowEnd (data: Buffer, at: number): number {
    if (at + 2 > data.length) return 0
    let end = at + 2
    for (let field = data.readInt16BE(at); field > 0; field--) {
      if (end + 4 > data.length) return 0
      end += 4 + Math.max(0, data.readInt32BE(end))
    }
    return end > data.length || data.readInt16BE(at) < 0 ? 0 : end
  }

  private row (data: Buffer, at: number, bytes: number): void {
    const hi = data.readInt32BE(at + 4)
    const lo = data.readUInt32BE(at + 8)
    const key = hi * (2 ** 32 / this.size) + Math.floor(lo / this.size)
    if (key !== this.key) this.finish()
    this.key = key
    for (let b = 0; b < 8; b++) this.idBytes[8 * this.count + b] = data[at + 11 - b] as number // to little-endian
    this.reserve(ROW_OVERHEAD_BYTES + MAX_ESCAPE_GROWTH * bytes + MEMBER_OVERHEAD_BYTES * this.members.length)
    this.ascii('{"id":')
    this.ascii(hi >= 0 && hi < 2 ** 21 ? String(hi * 2 ** 32 + lo) : data.readBigInt64BE(at + 4).toString())
    let field = at + 12
    for (const { prefix, type } of this.members) {
      const length = data.readInt32BE(field)
      field += 4
      if (length === -1) continue
      this.ascii(prefix) // not Buffer#copy: a call that costs more than these few bytes
      if (type === 'text') this.text(data, field, field + length)
      else if (type === 'boolean') this.ascii(data[field] === 0 ? 'false' : 'true')
      else if (type === 'bigint') this.ascii(data.readBigInt64BE(field).toString())
      else this.ascii(asNumber(data.readDoubleBE(field)))
      field += length
    }
    this.ascii('}')
    this.ends[this.count] = this.length
    this.ascii(',')
    this.count++
    this.copied++
  }

  private reserve (bytes: number): void {
    if (this.length + bytes <= this.out.length) return
    this.out = Buffer.concat([this.out.subarray(0, this.length)], 2 * this.out.length + bytes)
    this.outView = viewOf(this.out)
  }

  private ascii (text: string): void {
    for (let i = 0; i < text.length; i++) this.out[this.length++] = text.charCodeAt(i)
  }

  private text (data: Buffer, from: number, to: number): void {
    if (this.input?.data !== data) this.input = { data, view: viewOf(data) }
    const { out, outView, input: { view } } = this
    let j = this.length
    out[j++] = QUOTE
    for (let i = from; i < to;) {
      // Four bytes at once when none needs escaping: a byte below 0x20, 0x22 or 0x5c sets its high bit in one of these
      // differences while its own high bit is clear (Bit Twiddling Hacks, "a word has a byte less than n").
      const x = i + 4 <= to ? view.getUint32(i, true) : 0
      const escapes = ((x - 0x20202020) | ((x ^ 0x22222222) - 0x01010101) | ((x ^ 0x5c5c5c5c) - 0x01010101)) & ~x
      if ((escapes & 0x80808080) === 0) {
        outView.setUint32(j, x, true)
        j += 4
        i += 4
      } else {
        const byte = data[i++] as number
        const escaped = ESCAPED[byte]
        if (escaped === undefined) out[j++] = byte
        else j += out.write(escaped, j, 'latin1')
      }
    }
    out[j++] = QUOTE
    this.length = j
  }
}

const viewOf = (bytes: Buffer): DataView => new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)

// fast-json-stringify's asNumber: NaN has no JSON, an infinity is written as null.
function asNumber (value: number): string {
  if (Number.isNaN(value)) throw new Error('NaN cannot be written as JSON')
  return Number.isFinite(value) ? String(value) : 'null'
}
