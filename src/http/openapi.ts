import swagger from '@fastify/swagger'
import swaggerUi from '@fastify/swagger-ui'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import postmanCollection from './petstore.postman_collection.json' with { type: 'json' }

export const API_VERSION = '1.0.0'

/**
 * YAML 1.1 tools (PyYAML, Dredd) read a JSON document as YAML: they refuse DEL and the C1 controls raw, and
 * YAML 1.1 counts NEL, U+2028 and U+2029 as line breaks. As JSON escapes they are the same characters.
 */
const YAML_1_1_UNREADABLE = /[\u007F-\u009F\u2028\u2029]/g
export function escapeJsonControls (json: string): string {
  return json.replace(YAML_1_1_UNREADABLE, c => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)
}

/**
 * The Postman collection generated from this document (`npm run api:generate`, committed;
 * a test keeps it current), served beside it. Imported, so that it goes wherever the code goes
 * (tsc copies it into dist/), and written out as the file is.
 */
const POSTMAN_COLLECTION = `${JSON.stringify(postmanCollection, null, 2)}\n`

/**
 * YAML 1.2 allows DEL and the C1 controls other than NEL only escaped, and the yaml package
 * swagger-ui's /docs/yaml uses writes them raw (the patterns hold them as characters): strict
 * parsers (PyYAML) refuse the file. Inside a double-quoted scalar, \xNN is their escape.
 */
const YAML_DOUBLE_QUOTED = /"(?:[^"\\]|\\.)*"/g
const YAML_UNPRINTABLE = /[\u007F-\u0084\u0086-\u009F]/g
export function escapeYamlControls (yaml: string): string {
  return yaml.replace(YAML_DOUBLE_QUOTED, scalar => scalar.replace(YAML_UNPRINTABLE, c => `\\x${c.charCodeAt(0).toString(16)}`))
}

const serverUrl = (description: string, baseUrl: string): { url: string, description: string, variables: Record<string, { default: string, description: string }> } => ({
  url: '{base_url}/v1',
  description,
  variables: { base_url: { default: baseUrl, description: 'Scheme and host of the deployment' } }
})

/**
 * The first server is relative: a client (and the reference page's "Try it out")
 * resolves it against the address the document was fetched from, so it is always
 * the deployment that serves the page, whatever its host, port or scheme.
 */
export const SERVERS = [
  { url: '/v1', description: 'This deployment (the server that serves this document)' },
  serverUrl('Production', 'https://api.petstore.dev'),
  serverUrl('Staging', 'https://staging.api.petstore.dev')
]

/** What `x-stability` promises, shown to readers in the summary and description. */
const STABILITY: Record<string, string> = {
  experimental: 'Experimental: may change incompatibly or disappear in any release, without a deprecation period.',
  beta: 'Beta: its shape is settled, but it may still change, with notice in the changelog.'
}

interface Operation {
  summary?: string
  description?: string
  tags?: string[]
  security?: unknown
  'x-stability'?: string
}

/** Visible stability markers, added to the generated document. */
function annotate (operation: Operation): void {
  const stability = operation['x-stability']
  if (stability !== undefined && STABILITY[stability] !== undefined) {
    operation.summary = `${operation.summary ?? ''} (${stability})`
    operation.description = `${STABILITY[stability]}${operation.description === undefined ? '' : `\n\n${operation.description}`}`
  }
}

declare module 'fastify' {
  interface FastifyInstance {
    /** Describes a tag that routes name in their schemas' `tags` (the document lists the tags its operations use). */
    describeTag: (name: string, description: string) => void
  }
}

/**
 * The reference page's Content-Security-Policy: @fastify/swagger-ui's default, except
 * that `upgrade-insecure-requests` is sent only to a page fetched over https
 * (request.protocol honours TRUST_PROXY). Over plain HTTP (a LAN address, a container
 * port) it would make the browser fetch the page's own scripts over https, and fail.
 */
export function docsContentSecurityPolicy (request: FastifyRequest): string {
  return [
    "default-src 'self'", "base-uri 'self'", "font-src 'self' https: data:", "frame-ancestors 'self'",
    "img-src 'self' data: validator.swagger.io", "object-src 'none'", "script-src 'self'", "script-src-attr 'none'",
    "style-src 'self' https:",
    ...request.protocol === 'https' ? ['upgrade-insecure-requests'] : []
  ].join('; ')
}

/**
 * The OpenAPI 3.1 document is generated from the route schemas. Paths are
 * relative to the servers, which end in /v1; operational routes are hidden.
 */
export async function registerOpenApi (app: FastifyInstance): Promise<void> {
  const tagDescriptions = new Map<string, string>()
  app.decorate('describeTag', (name: string, description: string) => { tagDescriptions.set(name, description) })
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
      const tags = new Set<string>()
      for (const item of Object.values(openapi.paths ?? {})) {
        for (const operation of Object.values(item as Record<string, Operation>)) {
          annotate(operation)
          // Every path of the document is under /v1, where auth.ts asks every request for a key.
          operation.security = [{ bearer: [] }]
          for (const tag of operation.tags ?? []) tags.add(tag)
        }
      }
      openapi.tags = [...tags].map(name => ({ name, ...(tagDescriptions.has(name) ? { description: tagDescriptions.get(name) } : {}) }))
      return openapi
    }
  })
  // Its own scope, so that the hook below only runs for the reference page and its files.
  await app.register(async docs => {
    docs.addHook('onSend', async (request, reply, payload) => {
      reply.header('content-security-policy', docsContentSecurityPolicy(request))
      if (typeof payload !== 'string') return payload
      const route = request.routeOptions.url
      if (route === '/docs/yaml') return escapeYamlControls(payload)
      return route === '/docs/json' ? escapeJsonControls(payload) : payload
    })
    await docs.register(swaggerUi, {
      routePrefix: '/docs',
      // Vendor extensions (x-stability) are listed under each operation. No top bar: its logo
      // carries an inline <style> the policy blocks, and its box would load other documents.
      uiConfig: { showExtensions: true, displayOperationId: true, layout: 'BaseLayout' }
    })
  })
  app.get('/docs/openapi.json', { schema: { hide: true } }, async (_request, reply) =>
    reply.type('application/json; charset=utf-8').send(escapeJsonControls(JSON.stringify(app.swagger()))))
  app.get('/docs/petstore.postman_collection.json', { schema: { hide: true } }, async (_request, reply) =>
    reply.type('application/json; charset=utf-8').header('content-disposition', 'attachment; filename="petstore.postman_collection.json"').send(POSTMAN_COLLECTION))
}
