import { timingSafeEqual } from 'node:crypto'
import type { IncomingMessage } from 'node:http'
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
  /** False while `verified` would return undefined for any request (no limit can refuse a valid key now). */
  mayRefuseVerified: () => boolean
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
 * A keep-alive connection sends the same Authorization header on every request;
 * hashing it each time was the largest single cost of a cached GET
 * (docs/performance.md). So each connection remembers the last header that held
 * a valid key, and a request whose header equals it (compared in constant time:
 * behind a proxy one connection carries many clients) is that key again. Keys
 * are fixed for the life of the process, so a remembered header cannot go stale.
 * Returns that key's digest (cached-lists.ts reads it too, before Fastify).
 */
export function rememberedKey (req: IncomingMessage): Buffer | undefined {
  const header = req.headers.authorization
  const known = (req.socket as Remembering | null)?.[VERIFIED]
  return typeof header === 'string' && known !== undefined && sameText(header, known.header) ? known.digest : undefined
}

function remember (request: FastifyRequest, digest: Buffer): void {
  const header = request.headers.authorization
  const connection = request.raw.socket as Remembering | null
  if (typeof header === 'string' && connection !== null) connection[VERIFIED] = { header, digest }
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
 * A header this connection already presented with a valid key is answered
 * synchronously (rememberedDigest); any other goes through @fastify/bearer-auth
 * (case-insensitive scheme, RFC 6749), whose key check is ours: the key's
 * SHA-256 compared in constant time with every configured digest.
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
  let limits: AccessLimits | undefined
  app.addHook('onReady', function findLimits (done) {
    limits = app.hasDecorator('accessLimits') ? app.accessLimits : undefined
    done()
  })
  const admit = (request: FastifyRequest, reply: FastifyReply, done: (err?: Error) => void): void => {
    const pending = limits?.verified(request, reply)
    if (pending === undefined) done()
    else pending.then(() => { done() }, done)
  }
  const refuse = (request: FastifyRequest, reply: FastifyReply, done: (err?: Error) => void): void => {
    if (limits === undefined) done(unauthorized(request))
    else limits.failed(request, reply).then(() => { done(unauthorized(request)) }, done)
  }
  app.addHook('onRequest', function access (request, reply, done) {
    if (!isProtectedPath(request.url)) {
      done()
      return
    }
    const known = rememberedKey(request.raw)
    if (known !== undefined) {
      request.apiKeyDigest = known
      admit(request, reply, done)
      return
    }
    verify(request, reply, (err?: Error) => {
      const digest = request.apiKeyDigest
      if (err !== undefined || digest === null) {
        request.apiKeyDigest = null
        refuse(request, reply, done)
        return
      }
      remember(request, digest)
      admit(request, reply, done)
    })
  })
}

export default fp(auth, { name: 'auth' })
