import swagger from '@fastify/swagger'
import swaggerUi from '@fastify/swagger-ui'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import { ErrorCodes, MALFORMED_JSON, type ErrorBody } from './errors.js'

export const API_VERSION = '1.0.0'

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

/**
 * One true example per error status: what the service answers in that case (the
 * OpenAPI test compares them with live answers). Operations whose message differs
 * name their own below.
 */
const ERROR_EXAMPLES: Record<number, string> = {
  401: 'an API key is required: send Authorization: Bearer <key>',
  409: 'a request with this Idempotency-Key is still being processed; retry later',
  413: 'request body is larger than the limit',
  415: 'Content-Type must be application/json',
  422: 'this Idempotency-Key was already used with a different request body',
  429: 'too many failed authentication attempts from this address; retry in 42 s',
  500: 'internal error',
  503: 'the database is unavailable; retry shortly'
}
const OPERATION_ERROR_EXAMPLES: Record<string, Record<number, string | Array<{ summary: string, body: ErrorBody }>>> = {
  createCategory: {
    400: [
      { summary: 'A rule of NewCategory is broken', body: { code: 'VALIDATION_FAILED', message: "request body is missing the required member 'name'", status: 400 } },
      { summary: 'The body is not JSON', body: { code: MALFORMED_JSON, message: 'request body is not valid JSON', status: 400 } }
    ]
  },
  getCategory: { 400: "'id' must be a decimal integer from 1 to 9223372036854775807", 404: 'no category with id 42' },
  getPet: { 400: 'the request URL is not valid', 501: 'getPet is not implemented yet' },
  listOrders: { 501: 'listOrders is not implemented yet' }
}

/** What `x-stability` promises, shown to readers in the summary and description. */
const STABILITY: Record<string, string> = {
  experimental: 'Experimental: may change incompatibly or disappear in any release, without a deprecation period.',
  beta: 'Beta: its shape is settled, but it may still change, with notice in the changelog.'
}

interface Operation {
  operationId?: string
  summary?: string
  description?: string
  'x-stability'?: string
  responses?: Record<string, { content?: Record<string, { example?: unknown, examples?: Record<string, { summary: string, value: unknown }> }> }>
}

/** Error examples and visible stability markers, added to the generated document. */
function annotate (operation: Operation): void {
  const stability = operation['x-stability']
  if (stability !== undefined && STABILITY[stability] !== undefined) {
    operation.summary = `${operation.summary ?? ''} (${stability})`
    operation.description = `${STABILITY[stability]}${operation.description === undefined ? '' : `\n\n${operation.description}`}`
  }
  for (const [status, response] of Object.entries(operation.responses ?? {})) {
    const media = response.content?.['application/json']
    const code = (ErrorCodes as Record<string, string | undefined>)[status]
    if (media === undefined || code === undefined) continue
    const own = OPERATION_ERROR_EXAMPLES[operation.operationId ?? '']?.[Number(status)]
    if (Array.isArray(own)) {
      media.examples = Object.fromEntries(own.map(({ summary, body }) => [body.code, { summary, value: body }]))
      continue
    }
    const message = own ?? ERROR_EXAMPLES[Number(status)]
    // A documented error status without a true example is a mistake in this file, found by the OpenAPI test.
    if (message === undefined) throw new Error(`no error example for ${status} of ${operation.operationId ?? 'an operation'}`)
    media.example = { code, message, status: Number(status) }
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
    transform: ({ schema, url }) => ({ schema, url: url.replace(/^\/v1(?=\/|$)/, '') }),
    transformObject: (document) => {
      const openapi = 'openapiObject' in document ? document.openapiObject : document.swaggerObject
      for (const item of Object.values(openapi.paths ?? {})) {
        for (const operation of Object.values(item as Record<string, Operation>)) annotate(operation)
      }
      return openapi
    }
  })
  // Its own scope, so that the hook below only runs for the reference page and its files.
  await app.register(async docs => {
    docs.addHook('onSend', async (request, reply) => { reply.header('content-security-policy', docsContentSecurityPolicy(request)) })
    await docs.register(swaggerUi, {
      routePrefix: '/docs',
      // Vendor extensions (x-stability) are listed under each operation. No top bar: its logo
      // carries an inline <style> the policy blocks, and its box would load other documents.
      uiConfig: { showExtensions: true, displayOperationId: true, layout: 'BaseLayout' }
    })
  })
  app.get('/docs/openapi.json', { schema: { hide: true } }, async () => app.swagger())
}
