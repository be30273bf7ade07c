import swagger from '@fastify/swagger'
import swaggerUi from '@fastify/swagger-ui'
import type { FastifyInstance } from 'fastify'

export const API_VERSION = '1.0.0'

const serverUrl = (description: string, baseUrl: string): { url: string, description: string, variables: Record<string, { default: string, description: string }> } => ({
  url: '{base_url}/v1',
  description,
  variables: { base_url: { default: baseUrl, description: 'Scheme and host of the deployment' } }
})

/**
 * The OpenAPI 3.1 document is generated from the route schemas. Paths are
 * relative to the servers, which end in /v1; operational routes are hidden.
 */
export async function registerOpenApi (app: FastifyInstance): Promise<void> {
  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'Petstore API',
        version: API_VERSION,
        description: 'Categories of pets, with bearer API-key authentication. Every error is an Error object.',
        contact: { name: 'Petstore team', url: 'https://petstore.dev/support' },
        license: { name: 'MIT', identifier: 'MIT' }
      },
      servers: [
        serverUrl('Production', 'https://api.petstore.dev'),
        serverUrl('Staging', 'https://staging.api.petstore.dev')
      ],
      tags: [
        { name: 'categories', description: 'Categories of pets' },
        { name: 'pets', description: 'Pets (not implemented yet)' },
        { name: 'store', description: 'Store orders (not implemented yet)' }
      ],
      components: {
        securitySchemes: { bearer: { type: 'http', scheme: 'bearer', description: 'API key as a bearer token' } }
      },
      security: [{ bearer: [] }]
    },
    refResolver: {
      buildLocalReference: (json, _baseUri, _fragment, i) => typeof json.$id === 'string' ? json.$id : `def-${i}`
    },
    transform: ({ schema, url }) => ({ schema, url: url.replace(/^\/v1(?=\/|$)/, '') })
  })
  await app.register(swaggerUi, { routePrefix: '/docs', staticCSP: true })
  app.get('/docs/openapi.json', { schema: { hide: true } }, async () => app.swagger())
}
