import { timingSafeEqual } from 'node:crypto'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import bearerAuth from '@fastify/bearer-auth'
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

/**
 * The configured digest (the same Buffer every time) that the key's digest
 * matches, or undefined; compares with every digest, without an early exit.
 */
export function keyMatcher (digests: Buffer[]): (key: string) => Buffer | undefined {
  return (key: string) => {
    const digest = sha256(key)
    let found: Buffer | undefined
    for (const candidate of digests) {
      const same = timingSafeEqual(candidate, digest)
      found = same ? candidate : found
    }
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

/**
 * One onRequest hook for access under /v1, before the body is read: the key
 * check, and around it the limits of rate-limit.ts when that plugin is
 * registered: a request without a valid key is counted before its 401, and an
 * address over the failed-authentication limit gets 429 even with a valid key.
 * The key goes through @fastify/bearer-auth (case-insensitive scheme, RFC 6749),
 * whose check is ours: the key's SHA-256 compared in constant time with every
 * configured digest.
 */
async function auth (app: FastifyInstance, options: { digests: Buffer[] }): Promise<void> {
  const match = keyMatcher(options.digests)
  app.decorateRequest('apiKeyDigest', null)
  await app.register(bearerAuth, {
    keys: new Set<string>(),
    auth: (key: string, request: FastifyRequest) => {
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
  const limits = app.accessLimits
  const admit = (request: FastifyRequest, reply: FastifyReply, done: (err?: Error) => void): void => {
    const pending = limits.verified(request, reply)
    if (pending === undefined) done()
    else pending.then(() => { done() }, done)
  }
  const refuse = (request: FastifyRequest, reply: FastifyReply, done: (err?: Error) => void): void => {
    limits.failed(request, reply).then(() => { done(unauthorized(request)) }, done)
  }
  app.addHook('onRequest', function access (request, reply, done) {
    if (!isProtectedPath(request.url)) {
      done()
      return
    }
    verify(request, reply, (err?: Error) => {
      if (err !== undefined || request.apiKeyDigest === null) {
        request.apiKeyDigest = null
        refuse(request, reply, done)
        return
      }
      admit(request, reply, done)
    })
  })
}

export default fp(auth, { name: 'auth', dependencies: ['rate-limits', 'singleton-headers'] })
