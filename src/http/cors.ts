import cors from '@fastify/cors'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'

/** Every method a route under /v1 answers (test/http/cors.test.ts checks the routes against it). */
export const CORS_METHODS = ['GET', 'HEAD', 'POST', 'PATCH', 'DELETE']

// Registered before auth and the rate limits: a page can read every Error body, and a preflight (which never carries
// a key) counts neither as a failed authentication nor toward a key's limit. No origins: no CORS headers, no hook.
export default fp(async function corsOrigins (app: FastifyInstance, { origins }: { origins: string[] }): Promise<void> {
  if (origins.length === 0) return
  const allowed = new Set(origins)
  await app.register(cors, {
    origin: (origin, callback) => { callback(null, origin !== undefined && allowed.has(origin)) },
    methods: CORS_METHODS,
    allowedHeaders: ['Authorization', 'Content-Type', 'Idempotency-Key', 'If-Match', 'If-None-Match', 'X-Request-Id'],
    exposedHeaders: ['ETag', 'Link', 'Location', 'Retry-After', 'RateLimit', 'RateLimit-Policy', 'X-Request-Id',
      'Deprecation', 'Sunset'],
    maxAge: 600, // Chromium caps it at 2 hours
    // Any OPTIONS from an allowed origin is a preflight: 204, never the plugin's plain-text 400.
    strictPreflight: false
  })
  // The plugin answered allowed origins' preflights: one here is another origin's, 204 without
  // Access-Control-Allow-*, so the browser blocks the page's request.
  app.addHook('onRequest', function refusedPreflight (request, reply, done) {
    const { method, headers: h } = request
    if (method !== 'OPTIONS' || h.origin === undefined || h['access-control-request-method'] === undefined) {
      return done()
    }
    reply.code(204).header('content-length', '0').send()
  })
}, { name: 'cors' })
