import { Type } from 'typebox'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { errorResponses, notImplemented } from '../http/errors.js'

/** Placeholder required by the contract: the operation exists, is deprecated, and answers 501. */
export default fp(async function pets (app: FastifyInstance, options: { sunset: string | undefined }): Promise<void> {
  app.describeTag('pets', 'Pets (not implemented yet)')
  app.get('/v1/pets/:petId', {
    schema: {
      operationId: 'getPet',
      summary: 'Get a pet (deprecated placeholder)',
      description: 'Placeholder: the behaviour of this operation is not defined yet. It always answers ' +
        '501 NOT_IMPLEMENTED, with a Deprecation header and, when configured, a Sunset header.',
      deprecated: true,
      tags: ['pets'],
      params: Type.Object({ petId: Type.String({ description: 'Pet id (not interpreted yet)' }) }),
      // 400: a petId that is not valid percent-encoding, or longer than Fastify's 100 characters (error-handler.ts).
      response: errorResponses([400, 401, 429, 501], { 501: 'getPet is not implemented yet' })
    }
  }, async (_request, reply) => {
    reply.header('deprecation', 'true')
    if (options.sunset !== undefined) reply.header('sunset', options.sunset)
    throw notImplemented('getPet is not implemented yet')
  })
}, { name: 'pets', dependencies: ['openapi'] })
