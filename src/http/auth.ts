import { timingSafeEqual } from 'node:crypto'
import bearerAuth from '@fastify/bearer-auth'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { sha256 } from '../config.js'
import { ApiError } from './errors.js'

const REALM = 'Bearer realm="petstore"'

/** Paths that need a key: everything under /v1, known or not. */
export function isProtectedPath (url: string): boolean {
  return url === '/v1' || url.startsWith('/v1/') || url.startsWith('/v1?')
}

declare module 'fastify' {
  interface FastifyRequest {
    /** SHA-256 of the API key that authenticated this request (never the key itself); null outside /v1. */
    apiKeyDigest: Buffer | null
  }
}

/** The key's digest when it matches a configured one; compares with every digest, without an early exit. */
export function keyMatcher (digests: Buffer[]): (key: string) => Buffer | undefined {
  return (key: string) => {
    const digest = sha256(key)
    let match = false
    for (const candidate of digests) match = timingSafeEqual(candidate, digest) || match
    return match ? digest : undefined
  }
}

export function keyVerifier (digests: Buffer[]): (key: string) => boolean {
  const match = keyMatcher(digests)
  return (key: string) => match(key) !== undefined
}

function unauthorized (request: FastifyRequest): ApiError {
  // RFC 6750 section 3: error="invalid_token" only when a bearer token was actually sent.
  const sentToken = /^bearer\s+\S/i.test(request.headers.authorization ?? '')
  return new ApiError(401, 'UNAUTHORIZED',
    sentToken ? 'the API key is not valid' : 'an API key is required: send Authorization: Bearer <key>',
    { 'www-authenticate': sentToken ? `${REALM}, error="invalid_token"` : REALM })
}

/**
 * @fastify/bearer-auth checks the key (case-insensitive scheme, constant-time);
 * we run it in an onRequest hook, before the body is read, and turn its
 * failures into our 401 Error body with WWW-Authenticate.
 */
async function auth (app: FastifyInstance, options: { digests: Buffer[] }): Promise<void> {
  const match = keyMatcher(options.digests)
  app.decorateRequest('apiKeyDigest', null)
  await app.register(bearerAuth, {
    keys: new Set<string>(),
    auth: (key: string, request: FastifyRequest) => {
      // Already verified from this same header by the rate limiter's hook (one hash per request).
      if (request.apiKeyDigest !== null) return true
      const digest = match(key)
      if (digest !== undefined) request.apiKeyDigest = digest
      return digest !== undefined
    },
    addHook: false,
    specCompliance: 'rfc6749',
    verifyErrorLogLevel: 'debug'
  })
  const verify = app.verifyBearerAuth
  if (verify === undefined) throw new Error('@fastify/bearer-auth did not decorate verifyBearerAuth')
  app.addHook('onRequest', (request, reply, done) => {
    if (!isProtectedPath(request.url)) {
      done()
      return
    }
    verify(request, reply, (err?: Error) => { done(err === undefined ? undefined : unauthorized(request)) })
  })
}

export default fp(auth, { name: 'auth' })
