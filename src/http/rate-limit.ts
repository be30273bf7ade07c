import { createHmac } from 'node:crypto'
import rateLimit, { normalizeIP } from '@fastify/rate-limit'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import type { Config } from '../config.js'
import { requestKey } from './auth.js'
import { ApiError } from './errors.js'
import { LocalRateLimitStore, redisFirstStore } from './rate-limit-store.js'

declare module 'fastify' {
  interface FastifyInstance {
    accessLimits: { // around auth.ts's key check
      /** Without a valid key: counts the failure; rejects with 429 over the limit, else resolves (then 401). */
      failed: (request: FastifyRequest, reply: FastifyReply) => Promise<void>
      /** With a valid key: undefined when nothing can refuse it, else a promise that rejects with 429. */
      verified: (request: FastifyRequest, reply: FastifyReply) => Promise<void> | undefined
    }
  }
}

type LimitState = Exclude<Awaited<ReturnType<ReturnType<FastifyInstance['createRateLimit']>>>, { isAllowed: true }>

/** IETF draft-ietf-httpapi-ratelimit-headers (draft 8 and later): a named policy and its current state. */
function rateLimitHeaders (policy: string, state: LimitState): Record<string, string> {
  const reset = Math.max(1, state.ttlInSeconds)
  return {
    'ratelimit-policy': `"${policy}";q=${state.max};w=${Math.ceil(state.timeWindow / 1000)}`,
    ratelimit: `"${policy}";r=${state.remaining};t=${reset}`
  }
}

function tooManyRequests (message: string, policy: string, state: LimitState): ApiError {
  const reset = Math.max(1, state.ttlInSeconds)
  return new ApiError(429, 'RATE_LIMITED', `${message}; retry in ${reset} s`,
    { ...rateLimitHeaders(policy, { ...state, remaining: 0 }), 'retry-after': String(reset) })
}

/**
 * Failed authentications per address (request.ip: TRUST_PROXY decides), counted before the 401 in one atomic
 * increment; over the limit, even a valid key gets 429 until the window ends. And requests per key.
 */
async function rateLimits (app: FastifyInstance, options: Config['rateLimit'] & Pick<Config, 'redis'>): Promise<void> {
  const store = options.redis === undefined ? LocalRateLimitStore : await redisFirstStore(app, options.redis)
  await app.register(rateLimit, { global: false, store })

  const authFailures = app.createRateLimit({
    max: options.authFailures,
    timeWindow: options.windowMs,
    keyGenerator: (request) => `auth-failures:${normalizeIP(request.ip)}`
  })
  // Once per digest Buffer: a static key's lives as long as the app, a managed key's until the keys are read again.
  const perKeyNames = new WeakMap<Buffer, string>()
  const perKeyName = (digest: Buffer): string => {
    let name = perKeyNames.get(digest)
    if (name === undefined) {
      // Never the key nor its digest, which API_KEY_SHA256 would accept from whoever reads Redis.
      name = createHmac('sha256', digest).update('petstore per-key rate limit').digest('hex')
      perKeyNames.set(digest, name)
    }
    return name
  }
  const perKey = app.createRateLimit({
    max: (request) => request.apiKey?.ratePerMinute ?? options.perKeyPerMinute,
    timeWindow: 60_000,
    keyGenerator: (request) => `per-key:${perKeyName(requestKey(request).digest)}`
  })
  const hasPerKeyLimit = (request: FastifyRequest): boolean =>
    options.perKeyPerMinute > 0 || request.apiKey?.ratePerMinute !== undefined

  // Counted in memory, failures can only refuse an address within a window of this instance's last one.
  let failuresMayCountUntil = 0

  const failedAuthLimit = (state: LimitState): ApiError =>
    tooManyRequests('too many failed authentication attempts from this address', 'auth-failures', state)

  async function failed (request: FastifyRequest, reply: FastifyReply): Promise<void> {
    failuresMayCountUntil = Date.now() + options.windowMs
    const state = await authFailures(request)
    failuresMayCountUntil = Date.now() + options.windowMs
    if (state.isAllowed) return
    if (state.isExceeded) throw failedAuthLimit(state)
    reply.headers(rateLimitHeaders('auth-failures', state))
  }

  async function verifiedSlowly (request: FastifyRequest, reply: FastifyReply, readFailures: boolean): Promise<void> {
    if (readFailures) {
      const failures = await authFailures(request, { increment: false })
      if (!failures.isAllowed && failures.remaining === 0) throw failedAuthLimit(failures)
    }
    if (!hasPerKeyLimit(request)) return
    const state = await perKey(request)
    if (state.isAllowed) return
    if (state.isExceeded) throw tooManyRequests('too many requests for this API key', 'per-key', state)
    reply.headers(rateLimitHeaders('per-key', state))
  }

  function verified (request: FastifyRequest, reply: FastifyReply): Promise<void> | undefined {
    const readFailures = options.redis !== undefined || Date.now() < failuresMayCountUntil
    if (!readFailures && !hasPerKeyLimit(request)) return undefined
    return verifiedSlowly(request, reply, readFailures)
  }

  app.decorate('accessLimits', { failed, verified })
}

export default fp(rateLimits, { name: 'rate-limits', dependencies: ['metrics'] })
