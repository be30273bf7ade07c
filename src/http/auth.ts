import { timingSafeEqual } from 'node:crypto'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import bearerAuth from '@fastify/bearer-auth'
import fp from 'fastify-plugin'
import { sha256 } from '../config.js'
import { ApiKeyStore, wellFormedKey, type AuthenticatedKey } from './api-keys.js'
import { ApiError } from './errors.js'

const REALM = 'Bearer realm="petstore"'
const READ_METHODS = new Set(['GET', 'HEAD'])

/** Paths that need a key: everything under /v1, known or not. */
export function isProtectedPath (url: string): boolean {
  return url === '/v1' || url.startsWith('/v1/') || url.startsWith('/v1?')
}

declare module 'fastify' {
  interface FastifyRequest {
    /** The key that authenticated this request (its id, scope and SHA-256, never the key); null outside /v1. */
    apiKey: AuthenticatedKey | null
  }
  interface FastifyInstance {
    apiKeys: ApiKeyStore
  }
}

/** The static key whose digest matches, compared with every one without an early exit. */
export function keyMatcher (keys: AuthenticatedKey[]): (digest: Buffer) => AuthenticatedKey | undefined {
  return (digest: Buffer) => {
    let found: AuthenticatedKey | undefined
    for (const key of keys) found = timingSafeEqual(key.digest, digest) ? key : found
    return found
  }
}

export function unauthorized (request: FastifyRequest): ApiError {
  // RFC 6750 section 3: error="invalid_token" only when a bearer token was actually sent.
  const sentToken = /^bearer\s+\S/i.test(request.headers.authorization ?? '')
  return new ApiError(401, 'UNAUTHORIZED',
    sentToken ? 'the API key is not valid' : 'an API key is required: send Authorization: Bearer <key>',
    { 'www-authenticate': sentToken ? `${REALM}, error="invalid_token"` : REALM })
}

const forbidden = (request: FastifyRequest): ApiError => new ApiError(403, 'FORBIDDEN',
  `this API key has the read scope; ${request.method} needs a key with the write scope`)

/**
 * One onRequest hook under /v1, before the body is read: the key (static ones from the configuration, managed ones
 * from the ApiKeyStore), its scope, and around them the limits of rate-limit.ts: a request without a valid key is
 * counted before its 401, and an address over the failed-authentication limit gets 429 even with a valid key.
 */
async function auth (app: FastifyInstance, options: { digests: Buffer[] }): Promise<void> {
  const staticKeys = options.digests.map((digest, i): AuthenticatedKey =>
    ({ id: `static-${i + 1}`, scope: 'write', digest, expiresAt: Infinity, ratePerMinute: undefined }))
  const matchStatic = keyMatcher(staticKeys)
  const store = new ApiKeyStore(app.db, app.changeFeed, app.log)
  app.decorate('apiKeys', store)
  app.addHook('onReady', async () => { await store.start() })
  app.addHook('onClose', async () => { await store.stop() })
  app.decorateRequest('apiKey', null)
  await app.register(bearerAuth, {
    keys: new Set<string>(),
    auth: (key: string, request: FastifyRequest) => {
      const digest = sha256(key)
      const found = matchStatic(digest) ?? (wellFormedKey(key) ? store.find(digest) : undefined)
      if (found === undefined) return false
      request.apiKey = found
      return true
    },
    addHook: false,
    specCompliance: 'rfc6749',
    verifyErrorLogLevel: 'debug'
  })
  const verify = app.verifyBearerAuth
  if (verify === undefined) throw new Error('@fastify/bearer-auth did not decorate verifyBearerAuth')
  const limits = app.accessLimits
  const admit = (request: FastifyRequest, reply: FastifyReply, done: (err?: Error) => void): void => {
    const readOnly = request.apiKey?.scope === 'read' && !READ_METHODS.has(request.method)
    const refused = readOnly ? forbidden(request) : undefined
    const pending = limits.verified(request, reply)
    if (pending === undefined) done(refused)
    else pending.then(() => { done(refused) }, done)
  }
  app.addHook('onRequest', function access (request, reply, done) {
    if (!isProtectedPath(request.url)) {
      done()
      return
    }
    verify(request, reply, (err?: Error) => {
      if (err === undefined && request.apiKey !== null) {
        admit(request, reply, done)
        return
      }
      request.apiKey = null
      limits.failed(request, reply).then(() => { done(unauthorized(request)) }, done)
    })
  })
}

export default fp(auth, { name: 'auth', dependencies: ['rate-limits', 'protocol', 'data'] })
