import swagger from '@fastify/swagger'
import swaggerUi from '@fastify/swagger-ui'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import postmanCollection from './petstore.postman_collection.json' with { type: 'json' }

declare module 'fastify' {
  interface FastifyInstance { describeTag: (name: string, description: string) => void }
}

// YAML 1.1 tools (PyYAML, Dredd) read the JSON as YAML: they refuse DEL and C1 raw, and take NEL, U+2028, U+2029
// for line breaks. As JSON escapes they are the same characters.
const YAML_1_1_UNREADABLE = /[\u007F-\u009F\u2028\u2029]/g
const escapeJsonControls = (json: string): string =>
  json.replace(YAML_1_1_UNREADABLE, c => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)

// The yaml package behind /docs/yaml writes DEL and C1 raw; YAML 1.2 allows them only escaped (\xNN).
const YAML_DOUBLE_QUOTED = /"(?:[^"\\]|\\.)*"/g
const YAML_UNPRINTABLE = /[\u007F-\u0084\u0086-\u009F]/g
const escapeYamlControls = (yaml: string): string => yaml.replace(YAML_DOUBLE_QUOTED,
  scalar => scalar.replace(YAML_UNPRINTABLE, c => `\\x${c.charCodeAt(0).toString(16)}`))

// Imported rather than read, so that tsc copies it into dist/.
const POSTMAN_COLLECTION = `${JSON.stringify(postmanCollection, null, 2)}\n`
const JSON_TYPE = 'application/json; charset=utf-8'

const serverUrl = (description: string, baseUrl: string) => ({
  url: '{base_url}/v1',
  description,
  variables: { base_url: { default: baseUrl, description: 'Scheme and host of the deployment' } }
})

// Relative: "Try it out" calls the deployment that served the page, whatever its host, port or scheme.
const SERVERS = [
  { url: '/v1', description: 'This deployment (the server that serves this document)' },
  serverUrl('Production', 'https://api.petstore.dev'),
  serverUrl('Staging', 'https://staging.api.petstore.dev')
]

const STABILITY = {
  experimental: 'Experimental: may change incompatibly or disappear in any release, without a deprecation period.',
  beta: 'Beta: its shape is settled, but it may still change, with notice in the changelog.'
}

// Every operation of ours has a summary and a description.
interface Operation { summary: string, description: string, security: unknown, 'x-stability'?: keyof typeof STABILITY }

// @fastify/swagger-ui's default, but upgrade-insecure-requests only over https (request.protocol honours
// TRUST_PROXY): over plain HTTP it would make the browser fetch the page's own scripts over https, and fail.
const DOCS_POLICY = "default-src 'self'; base-uri 'self'; font-src 'self' https: data:; frame-ancestors 'self'; " +
  "img-src 'self' data: validator.swagger.io; object-src 'none'; script-src 'self'; script-src-attr 'none'; " +
  "style-src 'self' https:"

export default fp(async function openapi (app: FastifyInstance): Promise<void> {
  const tagDescriptions = new Map<string, string>()
  app.decorate('describeTag', (name: string, description: string) => { tagDescriptions.set(name, description) })
  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'Petstore API',
        version: '1.0.0',
        description: 'Categories of pets, with bearer API-key authentication. Every error is an Error object.',
        contact: { name: 'Petstore team', url: 'https://petstore.dev/support' },
        license: { name: 'MIT', identifier: 'MIT' }
      },
      servers: SERVERS,
      components: {
        securitySchemes: { bearer: { type: 'http', scheme: 'bearer', description: 'API key as a bearer token' } }
      },
      security: [{ bearer: [] }]
    },
    refResolver: {
      buildLocalReference: (json, _baseUri, _fragment, i) => typeof json.$id === 'string' ? json.$id : `def-${i}`
    },
    transform: ({ schema, url }) => ({ schema, url: url.replace(/^\/v1(?=\/|$)/, '') }),
    transformObject: (document) => {
      const openapi = 'openapiObject' in document ? document.openapiObject : document.swaggerObject
      for (const item of Object.values(openapi.paths ?? {})) {
        for (const operation of Object.values(item as Record<string, Operation>)) {
          const stability = operation['x-stability']
          if (stability !== undefined) {
            operation.summary = `${operation.summary} (${stability})`
            operation.description = `${STABILITY[stability]}\n\n${operation.description}`
          }
          // Every path of the document is under /v1, where auth.ts asks every request for a key.
          operation.security = [{ bearer: [] }]
        }
      }
      // Each tag is its plugin's, described before its routes: in the order of the paths.
      openapi.tags = [...tagDescriptions].map(([name, description]) => ({ name, description }))
      return openapi
    }
  })
  // Its own scope, so that the hook below only runs for the reference page and its files.
  await app.register(async docs => {
    docs.addHook('onSend', async (request, reply, payload) => {
      reply.header('content-security-policy',
        request.protocol === 'https' ? `${DOCS_POLICY}; upgrade-insecure-requests` : DOCS_POLICY)
      if (typeof payload !== 'string') return payload
      const route = request.routeOptions.url
      if (route === '/docs/yaml') return escapeYamlControls(payload)
      return route === '/docs/json' ? escapeJsonControls(payload) : payload
    })
    await docs.register(swaggerUi, {
      routePrefix: '/docs',
      // No top bar: its logo carries an inline <style> the policy blocks, and its box would load other documents.
      uiConfig: { showExtensions: true, displayOperationId: true, layout: 'BaseLayout' }
    })
  })
  app.get('/docs/openapi.json', { schema: { hide: true } }, async (_request, reply) =>
    reply.type(JSON_TYPE).send(escapeJsonControls(JSON.stringify(app.swagger()))))
  app.get('/docs/petstore.postman_collection.json', { schema: { hide: true } }, async (_request, reply) =>
    reply.type(JSON_TYPE).header('content-disposition', 'attachment; filename="petstore.postman_collection.json"')
      .send(POSTMAN_COLLECTION))
}, { name: 'openapi', dependencies: ['errors'] })
