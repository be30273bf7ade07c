import cors from '@fastify/cors'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'

/** Every method a route under /v1 answers (test/cors.test.ts checks the routes against it). */
export const CORS_METHODS = ['GET', 'HEAD', 'POST']

/** What a page may send: the key, JSON bodies, retries and conditional requests, its own request id. */
const ALLOWED_HEADERS = ['Authorization', 'Content-Type', 'Idempotency-Key', 'If-None-Match', 'X-Request-Id']

/** What a page may read beyond the CORS-safelisted headers (Content-Type, Content-Length, ...). */
const EXPOSED_HEADERS = ['ETag', 'Location', 'Retry-After', 'RateLimit', 'RateLimit-Policy', 'X-Request-Id', 'Deprecation', 'Sunset']

/** How long a browser may reuse a preflight answer (Chromium caps it at 2 hours). */
const PREFLIGHT_MAX_AGE_S = 600

/** A CORS preflight: what a browser sends, without credentials, before a request a page may not make on its own. */
function isPreflight (method: string, headers: Record<string, unknown>): boolean {
  return method === 'OPTIONS' && headers.origin !== undefined && headers['access-control-request-method'] !== undefined
}

/**
 * CORS through @fastify/cors, for pages on the configured origins; with none, nothing
 * is registered and responses carry no CORS headers. Its onRequest hook runs before
 * auth.ts's and the rate limits:
 * - a preflight from an allowed origin is answered there, 204 with the Allow headers;
 * - any other request from an allowed origin gets Access-Control-Allow-Origin and
 *   -Expose-Headers before anything can fail, so a page can read every Error body;
 * - requests from other origins get no Access-Control-* headers (the browser then
 *   hides the response); their preflights are answered 204 by the hook below.
 * A preflight never carries a key, so neither answer counts as a failed
 * authentication nor toward a key's limit. Every response carries Vary: Origin.
 */
async function corsOrigins (app: FastifyInstance, { origins }: { origins: string[] }): Promise<void> {
  if (origins.length === 0) return
  const allowed = new Set(origins)
  await app.register(cors, {
    origin: (origin, callback) => { callback(null, origin !== undefined && allowed.has(origin)) },
    methods: CORS_METHODS,
    allowedHeaders: ALLOWED_HEADERS,
    exposedHeaders: EXPOSED_HEADERS,
    maxAge: PREFLIGHT_MAX_AGE_S,
    // Any OPTIONS from an allowed origin is a preflight: 204, never the plugin's plain-text 400.
    strictPreflight: false
  })
  // Runs only when the plugin let a request through: a preflight here is from another origin.
  app.addHook('onRequest', function refusedPreflight (request, reply, done) {
    if (!isPreflight(request.method, request.headers)) {
      done()
      return
    }
    // Another origin's preflight: 204 without Access-Control-Allow-*, so the browser blocks the page's request.
    reply.code(204).header('content-length', '0').send()
  })
}

export default fp(corsOrigins, { name: 'cors' })
