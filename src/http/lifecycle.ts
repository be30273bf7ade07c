import { randomUUID } from 'node:crypto'
import type { IncomingMessage } from 'node:http'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'

declare module 'fastify' {
  interface FastifyInstance { lifecycle: { shuttingDown: boolean } } // server.ts flips it on SIGTERM
}

// A balancer's request id is kept when it is sane: it goes into logs and a header.
const REQUEST_ID = /^[\x21-\x7e]{1,128}$/
export function requestId (req: IncomingMessage): string {
  const header = req.headers['x-request-id']
  return typeof header === 'string' && REQUEST_ID.test(header) ? header : randomUUID()
}

// Connection: close from the moment shutdown begins, a request in flight included: keep-alive clients move to another
// instance, and no idle connection holds the process open.
async function lifecycle (app: FastifyInstance): Promise<void> {
  const state = { shuttingDown: false }
  app.decorate('lifecycle', state)
  app.addHook('onSend', function responseHeaders (request, reply, payload, done) {
    reply.header('x-request-id', request.id)
    if (state.shuttingDown && request.raw.httpVersionMajor < 2) reply.header('connection', 'close')
    done(null, payload)
  })
}

export default fp(lifecycle, { name: 'lifecycle' })
