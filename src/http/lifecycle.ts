import { randomUUID } from 'node:crypto'
import type { IncomingMessage } from 'node:http'
import type { FastifyInstance } from 'fastify'

/** What the instance knows about its own shutdown; server.ts flips it on SIGTERM. */
export interface Lifecycle {
  shuttingDown: boolean
}

/** A request id from the balancer is kept when it is sane (it goes into logs and a header); otherwise we make one. */
const REQUEST_ID = /^[\x21-\x7e]{1,128}$/
export function requestId (req: IncomingMessage): string {
  const header = req.headers['x-request-id']
  return typeof header === 'string' && REQUEST_ID.test(header) ? header : randomUUID()
}

/**
 * The headers every response carries, set in one onSend hook (every response
 * made through Fastify passes it, errors and 304s included):
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
