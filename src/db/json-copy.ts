import type pg from 'pg'
import { to as copyTo } from 'pg-copy-streams'

/** Rows whose ids share a key (id / segmentIds), as JSON: ids ascending, their objects joined by commas. */
export interface JsonSegment { key: bigint, ids: BigInt64Array, bytes: Buffer }

// PGCOPY\n\377\r\n\0, flags, header extension length.
const HEADER_BYTES = 19
// JSON.stringify's escapes (and fast-json-stringify's): these two-character ones, other C0 controls as \u00xx.
const SHORT_ESCAPES = new Uint8Array(128)
for (const [byte, escape] of [[8, 'b'], [9, 't'], [10, 'n'], [12, 'f'], [13, 'r'], [34, '"'], [92, '\\']] as const) {
  SHORT_ESCAPES[byte] = escape.charCodeAt(0)
}
const HEX = Buffer.from('0123456789abcdef')

/**
 * Writes rows as the route's compiled serializer does (member order of the schema, absent members left out,
 * int8 as a bare number), straight from the bytes of `COPY … TO STDOUT (FORMAT binary)`: no row objects, no
 * strings. Text is valid UTF-8 from PostgreSQL, so JSON.stringify's escaping is per byte.
 */
export class JsonCopyWriter {
  private readonly members: Array<{ prefix: Buffer, type: string }>
  private out = Buffer.allocUnsafe(1 << 20)
  private length = 0
  private readonly ids = new BigInt64Array(1024)
  private readonly idBytes = new Uint8Array(this.ids.buffer)
  private count = 0
  private key = -1
  private last = [0, 0]
  /** The rows of the last copy. */
  copied = 0

  constructor (columns: Record<string, string>, private readonly segmentIds: number,
    private readonly onSegment: (segment: JsonSegment) => void) {
    this.members = Object.entries(columns).map(([name, type]) => ({ prefix: Buffer.from(`,"${name}":`), type }))
    if (segmentIds > this.ids.length || 2 ** 32 % segmentIds !== 0) throw new Error('segmentIds: a power of two to 1024')
  }

  /** Runs one COPY whose columns are id, then the constructor's columns, each cast to its type. */
  async copy (client: pg.ClientBase, sql: string): Promise<void> {
    this.copied = 0
    let pending: Buffer = Buffer.alloc(0)
    let header = true
    for await (const chunk of client.query(copyTo(sql)) as AsyncIterable<Buffer>) {
      pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk])
      if (header && pending.length < HEADER_BYTES) continue
      pending = pending.subarray(this.rows(pending, header ? HEADER_BYTES + pending.readInt32BE(15) : 0))
      header = false
    }
  }

  get lastId (): bigint {
    return BigInt.asIntN(64, (BigInt(this.last[0] as number) << 32n) | BigInt(this.last[1] as number))
  }

  /** Hands over the last segment. */
  finish (): void {
    if (this.count === 0) return
    const bytes = Buffer.from(this.out.subarray(0, this.length - 1)) // without its trailing comma
    this.onSegment({ key: BigInt(this.key), ids: this.ids.slice(0, this.count), bytes })
    this.count = 0
    this.length = 0
  }

  /** Writes the whole rows in `data` from `offset`; returns where the first incomplete one starts. */
  private rows (data: Buffer, offset: number): number {
    let at = offset
    while (at + 2 <= data.length) {
      const fields = data.readInt16BE(at)
      if (fields === -1) return data.length // the trailer
      let end = at + 2
      for (let f = 0; f < fields; f++) {
        if (end + 4 > data.length) return at
        end += 4 + Math.max(0, data.readInt32BE(end))
      }
      if (end > data.length) return at
      this.row(data, at + 2, end - at)
      at = end
    }
    return at
  }

  private row (data: Buffer, at: number, bytes: number): void {
    const hi = data.readInt32BE(at + 4)
    const lo = data.readUInt32BE(at + 8)
    const key = hi * (2 ** 32 / this.segmentIds) + Math.floor(lo / this.segmentIds)
    if (key !== this.key) this.finish()
    this.key = key
    for (let b = 0; b < 8; b++) this.idBytes[this.count * 8 + b] = data[at + 11 - b] as number
    this.count++
    this.copied++
    this.last = [hi, lo]
    let field = at + 12
    // Escaping at most sextuples a byte.
    const need = 64 + 6 * bytes + 32 * this.members.length
    if (this.length + need > this.out.length) {
      const grown = Buffer.allocUnsafe(Math.max(2 * this.out.length, this.length + need))
      this.out.copy(grown, 0, 0, this.length)
      this.out = grown
    }
    this.ascii('{"id":')
    this.ascii(hi >= 0 && hi < 2 ** 21 ? String(hi * 2 ** 32 + lo) : data.readBigInt64BE(at + 4).toString())
    for (const { prefix, type } of this.members) {
      const length = data.readInt32BE(field)
      field += 4
      if (length === -1) continue
      this.length += prefix.copy(this.out, this.length)
      if (type === 'text') this.text(data, field, field + length)
      else if (type === 'boolean') this.ascii(data[field] === 0 ? 'false' : 'true')
      else if (type === 'bigint') this.ascii(data.readBigInt64BE(field).toString())
      else this.ascii(asNumber(data.readDoubleBE(field)))
      field += length
    }
    this.ascii('},')
  }

  private ascii (text: string): void {
    for (let i = 0; i < text.length; i++) this.out[this.length++] = text.charCodeAt(i)
  }

  private text (data: Buffer, from: number, to: number): void {
    const out = this.out
    let j = this.length
    out[j++] = 34
    for (let i = from; i < to; i++) {
      const byte = data[i] as number
      if (byte >= 32 && byte !== 34 && byte !== 92) {
        out[j++] = byte
        continue
      }
      out[j++] = 92
      const short = SHORT_ESCAPES[byte] as number
      if (short !== 0) {
        out[j++] = short
      } else {
        out[j++] = 117 // u00xx
        out[j++] = 48
        out[j++] = 48
        out[j++] = HEX[byte >> 4] as number
        out[j++] = HEX[byte & 15] as number
      }
    }
    out[j++] = 34
    this.length = j
  }
}

// fast-json-stringify's asNumber: NaN has no JSON, infinities are written as null.
function asNumber (value: number): string {
  if (Number.isNaN(value)) throw new Error('NaN cannot be written as JSON')
  return Number.isFinite(value) ? String(value) : 'null'
}
