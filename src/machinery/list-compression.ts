import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { constants, createBrotliCompress, createGzip, type Gzip, type BrotliCompress } from 'node:zlib'
import { Counter, type Registry } from 'prom-client'
import { FLAT_BYTES, type ListBody } from './list-cache.js'

/** The content codings a list is sent in besides identity. */
export type ListEncoding = 'br' | 'gzip'

/**
 * zlib's default level, and the Brotli quality usual for dynamic content: at 1,000,000 rows (142 MB) they
 * take about 0.6 s and 1-3 s of one threadpool thread for 8.4 MB and 2.6 MB (docs/performance.md). Brotli 5
 * took half as long again for no smaller output; this synthetic list flatters the fast levels.
 */
const GZIP_LEVEL = 6
const BROTLI_QUALITY = 4
/** Output handed back per turn of the event loop: the compressing itself runs in libuv's threadpool. */
const CHUNK_BYTES = 64 * 1024

/**
 * The tag of a list sent in a content coding: the identity tag with the coding appended, weak. Weak because
 * the compressed bytes depend on the zlib and Brotli builds (two instances, or one after an upgrade, may send
 * different bytes for the same list), and a strong tag promises the same bytes; If-None-Match compares weakly,
 * so a 304 is given exactly as for a strong tag.
 */
export function encodedTag (etag: string, encoding: ListEncoding): string {
  return `W/${etag.slice(0, -1)}-${encoding}"`
}

function compressor (encoding: ListEncoding, length: number): Gzip | BrotliCompress {
  if (encoding === 'gzip') return createGzip({ level: GZIP_LEVEL, chunkSize: CHUNK_BYTES })
  return createBrotliCompress({
    chunkSize: CHUNK_BYTES,
    params: { [constants.BROTLI_PARAM_QUALITY]: BROTLI_QUALITY, [constants.BROTLI_PARAM_MODE]: constants.BROTLI_MODE_TEXT, [constants.BROTLI_PARAM_SIZE_HINT]: length }
  })
}

/** The list's bytes through one compressing stream, part after part; the output kept as list-cache.ts keeps a body (one Buffer up to FLAT_BYTES, else parts). */
async function compress (list: ListBody, encoding: ListEncoding): Promise<ListBody> {
  const parts: Buffer[] = []
  let pending: Buffer[] = []
  let pendingBytes = 0
  let length = 0
  const input = Readable.from(Buffer.isBuffer(list.body) ? [list.body] : list.body, { objectMode: false })
  await pipeline(input, compressor(encoding, list.length), async function collect (output: AsyncIterable<Buffer>) {
    for await (const chunk of output) {
      pending.push(chunk)
      pendingBytes += chunk.length
      length += chunk.length
      if (pendingBytes >= FLAT_BYTES) {
        parts.push(Buffer.concat(pending, pendingBytes))
        pending = []
        pendingBytes = 0
      }
    }
  })
  if (pendingBytes > 0 || parts.length === 0) parts.push(Buffer.concat(pending, pendingBytes))
  return { body: parts.length === 1 ? parts[0] as Buffer : parts, length, etag: encodedTag(list.etag, encoding) }
}

export interface ListCompressorOptions {
  /** `categories` gives categories_list_compressions_total. */
  metricPrefix: string
  registry?: Registry
}

/**
 * A list's compressed bodies, made once per list version and encoding: kept beside the body they were made
 * from (a WeakMap keyed by it), so they go when the list cache drops that version. Reads that ask while a
 * compression runs share it. Compressing runs in zlib's threadpool, a chunk at a time, so the event loop
 * only collects output.
 */
export class ListCompressor {
  private readonly made = new WeakMap<ListBody, Partial<Record<ListEncoding, Promise<ListBody>>>>()
  /** Compressions started, by encoding: plain numbers the Counter reads when scraped. */
  readonly compressions: Record<ListEncoding, number> = { br: 0, gzip: 0 }

  constructor (options: ListCompressorOptions) {
    if (options.registry === undefined) return
    const compressions = this.compressions
    // eslint-disable-next-line no-new
    new Counter({
      name: `${options.metricPrefix}_list_compressions_total`,
      help: 'Compressions of the list by content coding: one per list version and coding asked for, shared by the reads meanwhile',
      labelNames: ['encoding'],
      registers: [options.registry],
      collect () {
        this.reset()
        for (const [encoding, count] of Object.entries(compressions)) this.labels(encoding).inc(count)
      }
    })
  }

  /** The list in this coding: compressed now, or the compression of this version already made or under way. */
  async compressed (list: ListBody, encoding: ListEncoding): Promise<ListBody> {
    const variants = this.made.get(list) ?? {}
    this.made.set(list, variants)
    const kept = variants[encoding]
    if (kept !== undefined) return await kept
    this.compressions[encoding]++
    const started = compress(list, encoding)
    variants[encoding] = started
    // A failure is not kept: the next read tries again.
    started.catch(() => { if (variants[encoding] === started) variants[encoding] = undefined })
    return await started
  }
}
