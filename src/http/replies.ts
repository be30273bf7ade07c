import { Readable } from 'node:stream'
import type { FastifyReply, FastifyRequest } from 'fastify'
import type { CreateOutcome } from '../machinery/collection.js'
import type { ListBody, ListSerializer } from '../machinery/list-cache.js'
import { encodedTag, type ListEncoding } from '../machinery/list-compression.js'
import { addVary, negotiateEncoding } from './content-coding.js'

/*
 * The handlers every resource's list and create routes share: a cached list with
 * its strong ETag (304 on If-None-Match), and a create's committed answer, its
 * own or remembered for an Idempotency-Key.
 */

const JSON_TYPE = 'application/json; charset=utf-8'

/** Lists shorter than this are sent as they are: a compressed one would save too little to pay for the work. */
export const COMPRESS_MIN_BYTES = 1024

const opaque = (tag: string): string => tag.startsWith('W/') ? tag.slice(2) : tag

/** If-None-Match (RFC 9110 13.1.2): `*`, or a list of tags compared weakly. */
export function ifNoneMatchHits (header: string | undefined, etag: string): boolean {
  if (header === undefined) return false
  if (header === etag) return true
  if (header.trim() === '*') return true
  const wanted = opaque(etag)
  for (const part of header.split(',')) {
    if (opaque(part.trim()) === wanted) return true
  }
  return false
}

/** A resource's list as its routes see it (machinery/collection.ts has this shape). */
export interface ListedResource<Row> {
  list: (serialize: ListSerializer<Row>) => Promise<ListBody>
  /** The list in a content coding, compressed once per version (machinery/list-compression.ts). */
  compressed: (list: ListBody, encoding: ListEncoding) => Promise<ListBody>
}

/**
 * 200 with the list, or 304 when If-None-Match names the tag of the representation the client would get;
 * either way with that ETag, no-cache and Vary: Accept-Encoding. The list goes in gzip or Brotli when
 * Accept-Encoding asks for one and it is at least COMPRESS_MIN_BYTES long; a 304 needs no compressing.
 * Resolves when the reply is sent: an async handler that sends a stream must wait for it, or Fastify ends
 * the reply empty when the handler's promise resolves.
 */
export async function sendList<Row> (request: FastifyRequest, reply: FastifyReply, resource: ListedResource<Row>, list: ListBody): Promise<void> {
  const encoding = list.length >= COMPRESS_MIN_BYTES ? negotiateEncoding(request.headers['accept-encoding']) : undefined
  const etag = encoding === undefined ? list.etag : encodedTag(list.etag, encoding)
  addVary(reply, 'Accept-Encoding')
  reply.header('cache-control', 'no-cache').header('etag', etag)
  if (ifNoneMatchHits(request.headers['if-none-match'], etag)) {
    await reply.code(304).send()
    return
  }
  const body = encoding === undefined ? list : await resource.compressed(list, encoding)
  if (encoding !== undefined) reply.header('content-encoding', encoding)
  reply.header('content-type', JSON_TYPE).header('content-length', body.length)
  // A long list is its parts, written one after another (list-cache.ts): never joined into one copy.
  await reply.send(Buffer.isBuffer(body.body) ? body.body : Readable.from(body.body, { objectMode: false }))
}

/** GET of a resource's list: from its cache, serialized by the route's own compiled 200 schema. */
export function listHandler<Row> (resource: ListedResource<Row>) {
  return async function sendResourceList (request: FastifyRequest, reply: FastifyReply): Promise<void> {
    const list = await resource.list(reply.getSerializationFunction('200') as unknown as ListSerializer<Row>)
    await sendList(request, reply, resource, list)
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
