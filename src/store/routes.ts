import type { FastifyInstance } from 'fastify'
import { errorResponses, notImplemented } from '../http/errors.js'
import { rejectOtherMethods } from '../http/method-not-allowed.js'

/** Placeholder required by the contract: the operation exists and answers 501. */
export function registerStoreRoutes (app: FastifyInstance): void {
  app.get('/v1/store/orders', {
    schema: {
      operationId: 'listOrders',
      summary: 'List store orders (placeholder)',
      description: 'Placeholder: the behaviour of this operation is not defined yet. It always answers 501 NOT_IMPLEMENTED.',
      tags: ['store'],
      security: [{ bearer: [] }],
      response: errorResponses(401, 429, 501)
    }
  }, async () => {
    throw notImplemented('listOrders is not implemented yet')
  })
  rejectOtherMethods(app, '/v1/store/orders', ['GET'])
}
