import { randomFillSync } from 'node:crypto'
import type { IncomingMessage } from 'node:http'
import type { FastifyInstance } from 'fastify'

/** What the instance knows about its own shutdown; server.ts flips it on SIGTERM. */
export interface Lifecycle {
  shuttingDown: boolean
}

/** A request id from the balancer is kept when it is sane; otherwise we make one (Fastify's genReqId, and cached-lists.ts). */
const REQUEST_ID = /^[\x21-\x7e]{1,128}$/
export function requestId (req: IncomingMessage): string {
  const header = req.headers['x-request-id']
  return typeof header === 'string' && REQUEST_ID.test(header) ? header : newUuid()
}

const UUIDS_PER_BATCH = 256
const HEX = Buffer.from('0123456789abcdef')
const randomBytes = Buffer.alloc(16 * UUIDS_PER_BATCH)
let batch = ''
let nextInBatch = UUIDS_PER_BATCH

/**
 * A random (version 4) UUID, as crypto.randomUUID makes, but cheaper per id:
 * randomUUID joins 20 strings for each, which the response's header block then
 * copies flat again (bench:perf showed both on a cached 304). These are written
 * 256 at a time, from one randomFillSync, as ASCII into one string; each id is
 * a slice of it.
 */
export function newUuid (): string {
  if (nextInBatch === UUIDS_PER_BATCH) {
    batch = uuidBatch()
    nextInBatch = 0
  }
  const start = 36 * nextInBatch++
  return batch.slice(start, start + 36)
}

function uuidBatch (): string {
  randomFillSync(randomBytes)
  const text = Buffer.allocUnsafe(36 * UUIDS_PER_BATCH)
  let at = 0
  for (let i = 0; i < randomBytes.length; i++) {
    const place = i & 15
    let byte = randomBytes[i] as number
    if (place === 6) byte = (byte & 0x0f) | 0x40 // version 4
    else if (place === 8) byte = (byte & 0x3f) | 0x80 // variant 10
    if (place === 4 || place === 6 || place === 8 || place === 10) text[at++] = 0x2d // '-'
    text[at++] = HEX[byte >> 4] as number
    text[at++] = HEX[byte & 15] as number
  }
  return text.toString('latin1')
}

/**
 * The headers every response carries, set in one onSend hook (every response
 * made through Fastify passes it, errors and 304s included; one hook instead
 * of two, bench/profile.ts):
 * - X-Request-Id: the request's id (the balancer's, or ours);
 * - from the moment shutdown begins, Connection: close, so keep-alive clients
 *   reconnect (through the balancer, to another instance) and no idle
 *   connection can hold the process open. It is decided at send time, so a
 *   request already in flight when the signal came gets it too.
 */
export function registerResponseHeaders (app: FastifyInstance, lifecycle: Lifecycle): void {
  app.addHook('onSend', function responseHeaders (request, reply, payload, done) {
    reply.header('x-request-id', request.id)
    if (lifecycle.shuttingDown && request.raw.httpVersionMajor < 2) reply.header('connection', 'close')
    done(null, payload)
  })
}
