import { hash, timingSafeEqual } from 'node:crypto'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { ApiError } from './errors.js'

const REALM = 'Bearer realm="petstore"'
const BEARER = 'bearer '

/** Paths that need a key: everything under /v1, known or not. */
export function isProtectedPath (url: string): boolean {
  return url === '/v1' || url.startsWith('/v1/') || url.startsWith('/v1?')
}

/**
 * What the failed-authentication and per-key limits (rate-limit.ts) do around
 * the key check. The access hook below calls them; without them (an app that
 * registers auth alone) only the key is checked.
 */
export interface AccessLimits {
  /** A request without a valid key: counts the failure; rejects with 429 over the limit, else resolves (the hook answers 401). */
  failed: (request: FastifyRequest, reply: FastifyReply) => Promise<void>
  /** A request with a valid key: undefined when nothing can refuse it, else a promise that rejects with 429. */
  verified: (request: FastifyRequest, reply: FastifyReply) => Promise<void> | undefined
}

declare module 'fastify' {
  interface FastifyRequest {
    /** SHA-256 of the API key that authenticated this request (never the key itself); null outside /v1. */
    apiKeyDigest: Buffer | null
  }
  interface FastifyInstance {
    accessLimits: AccessLimits
  }
}

/** SHA-256 in one call (crypto.hash: no Hash object per request). */
export function sha256 (key: string): Buffer {
  return hash('sha256', key, 'buffer') as unknown as Buffer
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

export function keyVerifier (digests: Buffer[]): (key: string) => boolean {
  const match = keyMatcher(digests)
  return (key: string) => match(key) !== undefined
}

/** The token as @fastify/bearer-auth (rfc6749 mode) read it: case-insensitive scheme, trimmed; undefined without it. */
export function bearerToken (header: string | undefined): string | undefined {
  if (typeof header !== 'string' || header.substring(0, BEARER.length).toLowerCase() !== BEARER) return undefined
  return header.substring(BEARER.length).trim()
}

/**
 * Equal strings, in a time that depends only on the length of `sent` (the
 * request's own header), never on where it first differs from `known`.
 */
function sameText (sent: string, known: string): boolean {
  const length = sent.length
  // Of another length, `sent` is compared with itself: the same loop, and the answer is already no.
  const other = known.length === length ? known : sent
  let diff = known.length ^ length
  for (let i = 0; i < length; i++) diff |= sent.charCodeAt(i) ^ other.charCodeAt(i)
  return diff === 0
}

/** The last Authorization header this connection presented that held a valid key, and that key's digest. */
interface Verified { header: string, digest: Buffer }
const VERIFIED = Symbol('petstore.verifiedAuthorization')
type Remembering = object & { [VERIFIED]?: Verified }

/**
 * The key check of every request under /v1. A keep-alive connection sends the
 * same Authorization header on every request; hashing it each time was the
 * largest single cost of a cached GET (docs/performance.md). So each
 * connection remembers the last header that held a valid key, and a request
 * whose header equals it (compared in constant time: behind a proxy one
 * connection carries many clients) is that key again. Any other header is
 * hashed and compared with every configured digest, as before, and a failure
 * is always counted. Keys are fixed for the life of the process, so a
 * remembered header cannot go stale.
 */
export function requestKeyChecker (digests: Buffer[]): (request: FastifyRequest) => Buffer | undefined {
  const match = keyMatcher(digests)
  return (request: FastifyRequest) => {
    const header = request.headers.authorization
    if (typeof header !== 'string' || header === '') return undefined
    const connection = request.raw.socket as Remembering | null
    const known = connection?.[VERIFIED]
    if (known !== undefined && sameText(header, known.header)) return known.digest
    const token = bearerToken(header)
    if (token === undefined) return undefined
    const digest = match(token)
    if (digest !== undefined && connection !== null) connection[VERIFIED] = { header, digest }
    return digest
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
 * check (case-insensitive scheme, constant-time comparison of digests), and
 * around it the limits of rate-limit.ts when that plugin is registered: a
 * request without a valid key is counted before its 401, and an address over
 * the failed-authentication limit gets 429 even with a valid key. A valid key
 * with nothing to count is answered synchronously, without a promise.
 */
async function auth (app: FastifyInstance, options: { digests: Buffer[] }): Promise<void> {
  const check = requestKeyChecker(options.digests)
  app.decorateRequest('apiKeyDigest', null)
  let limits: AccessLimits | undefined
  app.addHook('onReady', function findLimits (done) {
    limits = app.hasDecorator('accessLimits') ? app.accessLimits : undefined
    done()
  })
  app.addHook('onRequest', function access (request, reply, done) {
    if (!isProtectedPath(request.url)) {
      done()
      return
    }
    const digest = check(request)
    if (digest === undefined) {
      if (limits === undefined) {
        done(unauthorized(request))
        return
      }
      limits.failed(request, reply).then(() => { done(unauthorized(request)) }, done)
      return
    }
    request.apiKeyDigest = digest
    const pending = limits?.verified(request, reply)
    if (pending === undefined) {
      done()
      return
    }
    pending.then(() => { done() }, done)
  })
}

export default fp(auth, { name: 'auth' })
