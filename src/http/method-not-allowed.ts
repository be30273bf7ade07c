import type { FastifyInstance, HTTPMethods } from 'fastify'
import { ApiError } from './errors.js'

const METHODS: HTTPMethods[] = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'TRACE']

/**
 * Answers 405 with Allow for every other method on a known path. The check runs
 * in onRequest (after auth), so the body of a refused request is never read.
 */
export function rejectOtherMethods (app: FastifyInstance, url: string, allowed: HTTPMethods[]): void {
  const allow = [...allowed, ...(allowed.includes('GET') ? ['HEAD'] : [])].join(', ')
  const others = METHODS.filter(method => !allowed.includes(method))
  app.route({
    method: others,
    url,
    schema: { hide: true },
    onRequest: async (request) => {
      throw new ApiError(405, 'METHOD_NOT_ALLOWED', `${request.method} is not allowed on ${url}; use ${allow}`, { allow })
    },
    handler: async () => { throw new Error('unreachable: onRequest always refuses') }
  })
}
