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
