import { Readable } from 'node:stream'
import type { FastifyReply, FastifyRequest } from 'fastify'
import type { CreateOutcome } from '../machinery/collection.js'
import type { ListBody, ListSerializer } from '../machinery/list-cache.js'

/*
 * The handlers every resource's list and create routes share: a cached list with
 * its strong ETag (304 on If-None-Match), and a create's committed answer, its
 * own or remembered for an Idempotency-Key.
 */

const JSON_TYPE = 'application/json; charset=utf-8'

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

/**
 * 200 with the list, or 304 when If-None-Match names its tag; either way with its ETag and no-cache.
 * Returns the reply, a thenable: an async handler that sends a stream must await it (or return it), or
 * Fastify ends the reply empty when the handler's promise resolves.
 */
export function sendList (request: FastifyRequest, reply: FastifyReply, list: ListBody): FastifyReply {
  reply.header('cache-control', 'no-cache').header('etag', list.etag)
  if (ifNoneMatchHits(request.headers['if-none-match'], list.etag)) return reply.code(304).send()
  reply.header('content-type', JSON_TYPE).header('content-length', list.length)
  // A long list is its parts, written one after another (list-cache.ts): never joined into one copy.
  return reply.send(Buffer.isBuffer(list.body) ? list.body : Readable.from(list.body, { objectMode: false }))
}

/** A resource's list as its routes see it (machinery/collection.ts has this shape). */
export interface ListedResource<Row> {
  list: (serialize: ListSerializer<Row>) => Promise<ListBody>
}

/** GET of a resource's list: from its cache, serialized by the route's own compiled 200 schema. */
export function listHandler<Row> (resource: ListedResource<Row>) {
  return async function sendResourceList (request: FastifyRequest, reply: FastifyReply): Promise<void> {
    const list = await resource.list(reply.getSerializationFunction('200') as unknown as ListSerializer<Row>)
    await sendList(request, reply, list)
  }
}

/** A create's answer as committed with its Idempotency-Key record (already serialized). */
interface CommittedResponse { status: number, body: string, location: string | null }

/** A resource's creates as its routes see them (machinery/collection.ts has this shape). */
export interface CreatedResource<New, Row> {
  create: (input: New) => Promise<Row>
  createIdempotent: (owner: Buffer, key: string, input: New, answer: (row: Row) => CommittedResponse) => Promise<CreateOutcome<Row>>
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
      reply.code(201).header('location', location(row)).send(row)
      return
    }
    const serialize = reply.getSerializationFunction('201') as unknown as (row: Row) => string
    const outcome = await resource.createIdempotent(request.apiKeyDigest as Buffer, key, input,
      row => ({ status: 201, body: serialize(row), location: location(row) }))
    const { response } = outcome
    if (response.location !== null) reply.header('location', response.location)
    if (outcome.kind === 'replay') reply.header('idempotent-replayed', 'true')
    reply.code(response.status).header('content-type', JSON_TYPE).send(response.body)
  }
}
