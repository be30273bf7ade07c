import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { errorResponses, notImplemented } from '../http/errors.js'

/** Placeholder required by the contract: the operation exists and answers 501. */
export default fp(async function store (app: FastifyInstance): Promise<void> {
  app.describeTag('store', 'Store orders (not implemented yet)')
  app.get('/v1/store/orders', {
    schema: {
      operationId: 'listOrders',
      summary: 'List store orders (placeholder)',
      description: 'Placeholder: the behaviour of this operation is not defined yet. ' +
        'It always answers 501 NOT_IMPLEMENTED.',
      tags: ['store'],
      response: errorResponses([401, 429, 501], { 501: 'listOrders is not implemented yet' })
    }
  }, async () => { throw notImplemented('listOrders is not implemented yet') })
}, { name: 'store', dependencies: ['openapi'] })
