import { Readable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import { constants, createBrotliCompress, createGzip, type Gzip, type BrotliCompress } from 'node:zlib'
import { Counter, type Registry } from 'prom-client'
import { listBody, type ListBody } from './segmented-list.js'

export type ListEncoding = 'br' | 'gzip'

// Output handed back per turn of the event loop: the compressing itself runs in libuv's threadpool.
const CHUNK_BYTES = 64 * 1024

// Weak: the compressed bytes depend on the zlib and Brotli builds, so two instances may send different bytes for
// one list. If-None-Match compares weakly, so the 304s are the same as for a strong tag.
export function encodedTag (etag: string, encoding: ListEncoding): string {
  return `W/${etag.slice(0, -1)}-${encoding}"`
}

// gzip level 6 (zlib's default) and Brotli quality 4 (the usual one for dynamic content): docs/performance.md.
function compressor (encoding: ListEncoding, length: number): Gzip | BrotliCompress {
  if (encoding === 'gzip') return createGzip({ level: 6, chunkSize: CHUNK_BYTES })
  return createBrotliCompress({
    chunkSize: CHUNK_BYTES,
    params: {
      [constants.BROTLI_PARAM_QUALITY]: 4,
      [constants.BROTLI_PARAM_MODE]: constants.BROTLI_MODE_TEXT,
      [constants.BROTLI_PARAM_SIZE_HINT]: length
    }
  })
}

async function compress (list: ListBody, encoding: ListEncoding): Promise<ListBody> {
  const parts: Buffer[] = []
  const input = Readable.from(Buffer.isBuffer(list.body) ? [list.body] : list.body, { objectMode: false })
  await pipeline(input, compressor(encoding, list.length), async function collect (output: AsyncIterable<Buffer>) {
    for await (const chunk of output) parts.push(chunk)
  })
  return listBody(parts, encodedTag(list.etag, encoding))
}

/** Compresses a list once per list version and encoding, shared by the reads meanwhile. */
export function listCompressor (metricPrefix: string, registry: Registry):
(list: ListBody, encoding: ListEncoding) => Promise<ListBody> {
  // Keyed by the body they were made from: they go when the list cache drops that version.
  const made = new WeakMap<ListBody, Partial<Record<ListEncoding, Promise<ListBody>>>>()
  const compressions = new Counter({
    name: `${metricPrefix}_list_compressions_total`,
    help: 'Compressions of the list by content coding: one per list version and coding asked for, ' +
      'shared by the reads meanwhile',
    labelNames: ['encoding'],
    registers: [registry]
  })
  for (const encoding of ['br', 'gzip']) compressions.inc({ encoding }, 0)
  return async (list, encoding) => {
    const variants = made.get(list) ?? {}
    made.set(list, variants)
    const kept = variants[encoding]
    if (kept !== undefined) return await kept
    compressions.inc({ encoding })
    const started = compress(list, encoding)
    variants[encoding] = started
    // A failure is not kept: the next read tries again.
    started.catch(() => { if (variants[encoding] === started) variants[encoding] = undefined })
    return await started
  }
}
