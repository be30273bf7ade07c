import type { FastifyInstance } from 'fastify'

/** What the instance knows about its own shutdown; server.ts flips it on SIGTERM. */
export interface Lifecycle {
  shuttingDown: boolean
}

/**
 * From the moment shutdown begins every response carries Connection: close, so
 * keep-alive clients reconnect (through the balancer, to another instance) and
 * no idle connection can hold the process open.
 */
export function registerConnectionClose (app: FastifyInstance, lifecycle: Lifecycle): void {
  app.addHook('onSend', (request, reply, payload, done) => {
    if (lifecycle.shuttingDown && request.raw.httpVersionMajor < 2) reply.header('connection', 'close')
    done(null, payload)
  })
}
