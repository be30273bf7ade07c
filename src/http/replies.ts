import type { FastifyReply, FastifyRequest } from 'fastify'

/*
 * The replies every resource's list and create routes send the same way: a
 * cached list with its strong ETag (304 on If-None-Match), and a create's
 * committed answer, its own or remembered for an Idempotency-Key.
 */

/** If-None-Match (RFC 9110 13.1.2): `*`, or a list of tags compared weakly. */
export function ifNoneMatchHits (header: string | undefined, etag: string): boolean {
  if (header === undefined) return false
  if (header === etag) return true
  if (header.trim() === '*') return true
  for (const part of header.split(',')) {
    const tag = part.trim()
    if ((tag.startsWith('W/') ? tag.slice(2) : tag) === etag) return true
  }
  return false
}

/** A serialized list (UTF-8 bytes) and its strong ETag. */
export interface ListBody { body: Buffer, etag: string }

/** 200 with the list, or 304 when If-None-Match names its tag; either way with its ETag and no-cache. */
export function sendList (request: FastifyRequest, reply: FastifyReply, list: ListBody): void {
  reply.header('cache-control', 'no-cache').header('etag', list.etag)
  if (ifNoneMatchHits(request.headers['if-none-match'], list.etag)) reply.code(304).send()
  else reply.header('content-type', 'application/json; charset=utf-8').send(list.body)
}

/** A create's answer as committed with its Idempotency-Key record (already serialized). */
export interface CommittedResponse { status: number, body: string, location: string | null }

/** The committed answer: sent again as it is when `replayed` (with Idempotent-Replayed: true). */
export async function sendCommitted (reply: FastifyReply, response: CommittedResponse, replayed: boolean): Promise<FastifyReply> {
  if (response.location !== null) reply.header('location', response.location)
  reply.code(response.status)
  if (replayed) reply.header('idempotent-replayed', 'true')
  return await reply.header('content-type', 'application/json; charset=utf-8').send(response.body)
}

/** A resource's list as its routes see it (machinery/collection.ts has this shape). */
export interface ListedResource<Row> {
  cached: () => ListBody | undefined
  list: (serialize: (rows: Row[]) => string) => Promise<ListBody>
}

/** Set on every list handler: the resource whose cached list cached-lists.ts may answer before Fastify. */
export const LISTED = Symbol('petstore.listedResource')
export interface ListRouteHandler { [LISTED]?: { cached: () => ListBody | undefined } }

/** GET of a resource's list: a cache hit is answered at once (no promise for Fastify to wait for), else read and sent. */
export function listHandler<Row> (resource: ListedResource<Row>) {
  return Object.assign(function sendResourceList (request: FastifyRequest, reply: FastifyReply): Promise<void> | undefined {
    const hit = resource.cached()
    if (hit !== undefined) {
      sendList(request, reply, hit)
      return
    }
    // The route's own compiled 200 serializer: the cached body is exactly what the schema would produce.
    return resource.list(reply.getSerializationFunction('200') as unknown as (rows: Row[]) => string).then(list => { sendList(request, reply, list) })
  }, { [LISTED]: resource })
}

/** A resource's creates as its routes see them (machinery/collection.ts has this shape). */
export interface CreatedResource<New, Row> {
  create: (input: New) => Promise<Row>
  createIdempotent: (owner: Buffer, key: string, input: New, answer: (row: Row) => CommittedResponse) => Promise<{ kind: 'created' | 'replay', response: CommittedResponse }>
}

/**
 * POST of a resource: 201 with the committed row and its Location. With an Idempotency-Key the row
 * and the remembered answer commit together (one transaction, no batching), and a retry replays it.
 */
export function createHandler<New, Row> (resource: CreatedResource<New, Row>, location: (row: Row) => string) {
  return async function createResource (request: FastifyRequest, reply: FastifyReply): Promise<void> {
    // The route's schema validated both.
    const input = request.body as New
    const key = request.headers['idempotency-key'] as string | undefined
    if (key === undefined) {
      const row = await resource.create(input)
      await reply.code(201).header('location', location(row)).send(row)
      return
    }
    const serialize = reply.getSerializationFunction('201') as unknown as (row: Row) => string
    const outcome = await resource.createIdempotent(request.apiKeyDigest as Buffer, key, input,
      row => ({ status: 201, body: serialize(row), location: location(row) }))
    await sendCommitted(reply, outcome.response, outcome.kind === 'replay')
  }
}
