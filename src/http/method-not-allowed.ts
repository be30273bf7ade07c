import { METHODS } from 'node:http'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { ApiError } from './errors.js'

// OPTIONS is only @fastify/cors's catch-all; CONNECT never reaches the router. HEAD last.
const CANDIDATES = [...METHODS.filter(m => m !== 'OPTIONS' && m !== 'CONNECT' && m !== 'HEAD'), 'HEAD']

// A known path with another method is 405 with Allow, not 404: after auth (only a valid key learns a path's methods),
// before the body. Only the 404 handler and @fastify/cors's OPTIONS '*' can be one; is404 first: routeOptions builds
// an object per call.
export default fp(async function methodNotAllowed (app: FastifyInstance): Promise<void> {
  app.addHook('onRequest', function methodNotAllowed (request, _reply, done) {
    if (request.is404 || (request.method === 'OPTIONS' && request.routeOptions.url === '*')) {
      const path = request.url.split('?')[0] ?? ''
      const allow = CANDIDATES.filter(method => app.findRoute({ method, url: path }) !== null).join(', ')
      const message = `${request.method} is not allowed on ${path}; use ${allow}`
      if (allow !== '') return done(new ApiError(405, 'METHOD_NOT_ALLOWED', message, { allow }))
    }
    done()
  })
}, { name: 'method-not-allowed', dependencies: ['auth'] })
