import { Readable } from 'node:stream'
import type { FastifyReply, FastifyRequest } from 'fastify'
import type { Row } from '../db/table.js'
import type { Collection } from '../machinery/collection.js'
import type { ListSerializer } from '../machinery/list-cache.js'
import { encodedTag } from '../machinery/list-compression.js'
import type { AuthenticatedKey } from '../keys/store.js'
import { negotiateEncoding } from './content-coding.js'
import { notFound } from './errors.js'

const JSON_TYPE = 'application/json; charset=utf-8'

// Below this, compressing would save too little to pay for the work.
const COMPRESS_MIN_BYTES = 1024

const opaque = (tag: string): string => tag.startsWith('W/') ? tag.slice(2) : tag

/** If-None-Match (RFC 9110 13.1.2): `*`, or a list of tags compared weakly. */
export function ifNoneMatchHits (header: string | undefined, etag: string): boolean {
  return header?.trim() === '*' || header?.split(',').some(part => opaque(part.trim()) === opaque(etag)) === true
}

/** From the resource's cache, serialized by the route's own compiled 200 schema. */
export function listHandler<New extends object, T extends Row> (resource: Collection<New, T>) {
  // Resolves when the reply is sent: Fastify would end a streamed reply empty when an async handler resolved before.
  return async function sendResourceList (request: FastifyRequest, reply: FastifyReply): Promise<void> {
    const list = await resource.list(reply.getSerializationFunction('200') as unknown as ListSerializer<T>)
    const accepted = request.headers['accept-encoding']
    const encoding = list.length >= COMPRESS_MIN_BYTES ? negotiateEncoding(accepted) : undefined
    const etag = encoding === undefined ? list.etag : encodedTag(list.etag, encoding)
    // Vary holds at most CORS's Origin here.
    const vary = reply.getHeader('vary')
    reply.header('vary', vary === undefined ? 'Accept-Encoding' : `${String(vary)}, Accept-Encoding`)
    reply.header('cache-control', 'no-cache').header('etag', etag)
    if (ifNoneMatchHits(request.headers['if-none-match'], etag)) {
      await reply.code(304).send()
      return
    }
    const body = encoding === undefined ? list : await resource.compressed(list, encoding)
    if (encoding !== undefined) reply.header('content-encoding', encoding)
    reply.header('content-type', JSON_TYPE).header('content-length', body.length)
    // A long list is its parts, written one after another: never joined into one copy.
    await reply.send(Buffer.isBuffer(body.body) ? body.body : inTurns(body.body))
  }
}

// A write to a reader that keeps up ends at once, and the next part would follow on the same turn of the event loop.
export function inTurns (parts: readonly Buffer[]): Readable {
  let next = 0
  let turn = performance.now()
  return new Readable({
    read () {
      if (performance.now() - turn <= 5) this.push(parts[next++] ?? null)
      else setImmediate(() => { turn = performance.now(); this.push(parts[next++] ?? null) })
    }
  })
}

export function createHandler<New extends object, T extends Row> (resource: Collection<New, T>, path: string) {
  return async function createResource (request: FastifyRequest, reply: FastifyReply): Promise<void> {
    const input = request.body as New
    const key = request.headers['idempotency-key'] as string | undefined
    if (key === undefined) {
      const row = await resource.create(input)
      reply.code(201).header('location', `${path}/${row.id}`).send(row)
      return
    }
    const serialize = reply.getSerializationFunction('201') as unknown as (row: T) => string
    const { kind, response } = await resource.createIdempotent((request.apiKey as AuthenticatedKey).digest, key, input,
      row => ({ status: 201, body: serialize(row), location: `${path}/${row.id}` }))
    if (response.location !== null) reply.header('location', response.location)
    if (kind === 'replay') reply.header('idempotent-replayed', 'true')
    reply.code(response.status).header('content-type', JSON_TYPE).send(response.body)
  }
}

export function getHandler<New extends object, T extends Row> (resource: Collection<New, T>, singular: string) {
  return async function getResource (request: FastifyRequest<{ Params: { id: bigint } }>): Promise<T> {
    const row = await resource.get(request.params.id)
    if (row === undefined) throw notFound(`no ${singular} with id ${request.params.id}`)
    return row
  }
}
