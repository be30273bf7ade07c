import { Readable } from 'node:stream'
import type { FastifyReply, FastifyRequest } from 'fastify'
import type { Precondition, Row } from '../db/table.js'
import type { Collection } from '../machinery/collection.js'
import { encodedTag } from '../machinery/list-compression.js'
import { requestKey } from './auth.js'
import { negotiateEncoding } from './content-coding.js'
import { ApiError, notFound, validationFailed } from './errors.js'

const JSON_TYPE = 'application/json; charset=utf-8'

// Below this, compressing would save too little to pay for the work.
const COMPRESS_MIN_BYTES = 1024

/** How long a long list's send may keep the event loop before it lets others in. */
const SEND_TURN_MS = 5

type IdRequest = FastifyRequest<{ Params: { id: bigint } }>

const opaque = (tag: string): string => tag.startsWith('W/') ? tag.slice(2) : tag

/** If-None-Match (RFC 9110 13.1.2): `*`, or a list of tags compared weakly. */
export function ifNoneMatchHits (header: string | undefined, etag: string): boolean {
  return header?.trim() === '*' || header?.split(',').some(part => opaque(part.trim()) === opaque(etag)) === true
}

/** A row's strong ETag: its id and version (db/table.ts), so that no other row's tag can name it. */
export const itemTag = (id: bigint, version: string): string => `"${id}-${version}"`

/**
 * If-Match (RFC 9110 13.1.1) as the row versions it accepts: none sent or `*`, any (a missing row is still 404:
 * 13.2.1); else the versions of the strong tags that name this row (a weak tag never matches).
 */
export function preconditionOf (header: string | undefined, id: bigint): Precondition {
  if (header === undefined || header.trim() === '*') return undefined
  const prefix = `"${id}-`
  return header.split(',').map(part => part.trim())
    .filter(tag => tag.startsWith(prefix) && tag.endsWith('"'))
    .map(tag => tag.slice(prefix.length, -1))
    .filter(version => /^[0-9]{1,10}$/.test(version))
}

export const preconditionMessage = (singular: string, id: bigint): string =>
  `${singular} ${id} has changed since it was read: If-Match does not name its current ETag`

const preconditionFailed = (singular: string, id: bigint): ApiError =>
  new ApiError(412, 'PRECONDITION_FAILED', preconditionMessage(singular, id))

/** The whole list from the resource's cache, or a page of it (limit, after). */
export function listHandler<New extends object, T extends Row> (resource: Collection<New, T>, path: string) {
  // Resolves when the reply is sent: Fastify would end a streamed reply empty when an async handler resolved before.
  return async function sendResourceList (
    request: FastifyRequest<{ Querystring: { limit?: number, after?: bigint } }>, reply: FastifyReply): Promise<void> {
    const { limit, after } = request.query
    if (limit !== undefined) {
      await sendPage(resource, path, limit, after, reply)
      return
    }
    if (after !== undefined) throw validationFailed("'after' is used with 'limit': send both, or neither")
    const list = await resource.list.read()
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

/** A page: its rows, and (RFC 8288) the next page's address while rows follow it. */
async function sendPage<New extends object, T extends Row> (resource: Collection<New, T>, path: string,
  limit: number, after: bigint | undefined, reply: FastifyReply): Promise<void> {
  const page = await resource.list.page(after ?? 0n, limit)
  if (page.more) reply.header('link', `<${path}?limit=${limit}&after=${page.lastId}>; rel="next"`)
  await reply.header('cache-control', 'no-cache').header('content-type', JSON_TYPE).send(page.body)
}

// A write to a reader that keeps up ends at once, and the next part would follow on the same turn of the event loop.
export function inTurns (parts: readonly Buffer[]): Readable {
  let next = 0
  let turn = performance.now()
  return new Readable({
    read () {
      if (performance.now() - turn <= SEND_TURN_MS) {
        this.push(parts[next++] ?? null)
        return
      }
      setImmediate(() => {
        turn = performance.now()
        this.push(parts[next++] ?? null)
      })
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
    const { kind, response } = await resource.createIdempotent(requestKey(request).digest, key, input,
      row => ({ status: 201, body: serialize(row), location: `${path}/${row.id}` }))
    if (response.location !== null) reply.header('location', response.location)
    if (kind === 'replay') reply.header('idempotent-replayed', 'true')
    reply.code(response.status).header('content-type', JSON_TYPE).send(response.body)
  }
}

export function getHandler<New extends object, T extends Row> (resource: Collection<New, T>, singular: string) {
  return async function getResource (request: IdRequest, reply: FastifyReply): Promise<T | undefined> {
    const { id } = request.params
    const found = await resource.table.get(id)
    if (found === undefined) throw notFound(`no ${singular} with id ${id}`)
    const etag = itemTag(id, found.version)
    reply.header('etag', etag).header('cache-control', 'no-cache')
    if (!ifNoneMatchHits(request.headers['if-none-match'], etag)) return found.row
    await reply.code(304).send()
    return undefined
  }
}

/** PATCH: a JSON merge patch (RFC 7396) of the create body, validated by the route's patch schema. */
export function updateHandler<New extends object, T extends Row> (resource: Collection<New, T>, singular: string) {
  return async function updateResource (request: IdRequest, reply: FastifyReply): Promise<T> {
    const { id } = request.params
    const patch = request.body as Record<string, unknown>
    const outcome = await resource.update(id, patch, preconditionOf(request.headers['if-match'], id))
    if (outcome === 'missing') throw notFound(`no ${singular} with id ${id}`)
    if (outcome === 'mismatch') throw preconditionFailed(singular, id)
    reply.header('etag', itemTag(id, outcome.version))
    return outcome.row
  }
}

export function deleteHandler<New extends object, T extends Row> (resource: Collection<New, T>, singular: string) {
  return async function deleteResource (request: IdRequest, reply: FastifyReply): Promise<void> {
    const { id } = request.params
    const outcome = await resource.delete(id, preconditionOf(request.headers['if-match'], id))
    if (outcome === 'missing') throw notFound(`no ${singular} with id ${id}`)
    if (outcome === 'mismatch') throw preconditionFailed(singular, id)
    await reply.code(204).send()
  }
}
