import type { FastifyInstance } from 'fastify'

/** What the instance knows about its own shutdown; server.ts flips it on SIGTERM. */
export interface Lifecycle {
  shuttingDown: boolean
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
  app.addHook('onSend', (request, reply, payload, done) => {
    reply.header('x-request-id', request.id)
    if (lifecycle.shuttingDown && request.raw.httpVersionMajor < 2) reply.header('connection', 'close')
    done(null, payload)
  })
}
