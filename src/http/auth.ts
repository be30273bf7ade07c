import { timingSafeEqual } from 'node:crypto'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import bearerAuth from '@fastify/bearer-auth'
import fp from 'fastify-plugin'
import { sha256 } from '../config.js'
import { ApiKeyStore, wellFormedKey, type AuthenticatedKey } from '../keys/store.js'
import { ApiError } from './errors.js'
import { registerKeyStoreMetrics } from './metrics.js'

const REALM = 'Bearer realm="petstore"'
const READ_METHODS = new Set(['GET', 'HEAD'])

const isProtectedPath = (url: string): boolean => url === '/v1' || url.startsWith('/v1/') || url.startsWith('/v1?')

declare module 'fastify' {
  interface FastifyRequest {
    /** The key that authenticated this request (its id, scope and SHA-256, never the key); null outside /v1. */
    apiKey: AuthenticatedKey | null
  }
  interface FastifyInstance { apiKeys: ApiKeyStore }
}

/** The key that authenticated this request: every request under /v1 has one, or was refused before its handler. */
export function requestKey (request: FastifyRequest): AuthenticatedKey {
  if (request.apiKey === null) throw new Error(`${request.url}: no API key authenticated this request`)
  return request.apiKey
}

function unauthorized (request: FastifyRequest): ApiError {
  // RFC 6750 section 3: error="invalid_token" only when a bearer token was actually sent.
  const sentToken = /^bearer\s+\S/i.test(request.headers.authorization ?? '')
  return new ApiError(401, 'UNAUTHORIZED',
    sentToken ? 'the API key is not valid' : 'an API key is required: send Authorization: Bearer <key>',
    { 'www-authenticate': sentToken ? `${REALM}, error="invalid_token"` : REALM })
}

/**
 * One onRequest hook on every /v1 path, known or not, before the body is read: the key (static or managed), its
 * scope, and rate-limit.ts: a failed key counts before its 401; an address over that limit gets 429 even with a key.
 */
async function auth (app: FastifyInstance, options: { digests: Buffer[] }): Promise<void> {
  const staticKeys = options.digests.map((digest, i): AuthenticatedKey =>
    ({ id: `static-${i + 1}`, scope: 'write', digest, expiresAt: Infinity, ratePerMinute: undefined }))
  // Compared with every static key, without an early exit.
  const matchStatic = (digest: Buffer): AuthenticatedKey | undefined => staticKeys
    .reduce<AuthenticatedKey | undefined>((found, key) => timingSafeEqual(key.digest, digest) ? key : found, undefined)
  const store = new ApiKeyStore(app.db, app.changeFeed, app.log)
  app.decorate('apiKeys', store)
  registerKeyStoreMetrics(app.metrics, store)
  app.addHook('onReady', async () => { await store.start() })
  app.addHook('onClose', async () => { await store.stop() })
  app.decorateRequest('apiKey', null)
  await app.register(bearerAuth, {
    keys: new Set<string>(),
    auth: (key: string, request: FastifyRequest) => {
      const digest = sha256(key)
      request.apiKey = matchStatic(digest) ?? (wellFormedKey(key) ? store.find(digest) : undefined) ?? null
      return request.apiKey !== null
    },
    addHook: false,
    specCompliance: 'rfc6749',
    verifyErrorLogLevel: 'debug'
  })
  const verify = app.verifyBearerAuth
  if (verify === undefined) throw new Error('@fastify/bearer-auth did not decorate verifyBearerAuth')
  app.addHook('onRequest', function access (request, reply, done) {
    if (!isProtectedPath(request.url)) return done()
    verify(request, reply, (err?: Error) => {
      if (err !== undefined || request.apiKey === null) {
        request.apiKey = null
        app.accessLimits.failed(request, reply).then(() => { done(unauthorized(request)) }, done)
        return
      }
      const refused = request.apiKey.scope === 'read' && !READ_METHODS.has(request.method)
        ? new ApiError(403, 'FORBIDDEN',
          `this API key has the read scope; ${request.method} needs a key with the write scope`)
        : undefined
      const pending = app.accessLimits.verified(request, reply)
      if (pending === undefined) done(refused)
      else pending.then(() => { done(refused) }, done)
    })
  })
}

export default fp(auth, { name: 'auth', dependencies: ['rate-limits', 'protocol', 'data'] })
