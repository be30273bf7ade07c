import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { validationFailed } from './errors.js'

/**
 * Headers RFC 9110 allows once, and that the service reads. Sent twice, Node keeps
 * the first Authorization, Content-Type or Host and drops the rest, and joins two
 * Idempotency-Keys or X-Request-Ids with ", "; a proxy in front may pick the other
 * one. (Content-Length twice Node refuses itself; If-None-Match and X-Forwarded-For
 * are lists, which every component combines alike.) docs/hardening.md has each.
 */
const NAMES = ['authorization', 'content-type', 'host', 'idempotency-key', 'x-request-id']
const CANONICAL = ['Authorization', 'Content-Type', 'Host', 'Idempotency-Key', 'X-Request-Id']

/** The first singleton header sent more than once, by its canonical name, or undefined. */
export function repeatedSingleton (rawHeaders: string[]): string | undefined {
  let seen = 0 // bit j: NAMES[j] was sent
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const raw = rawHeaders[i] as string
    const length = raw.length
    // Every request pays for this loop: most names are ruled out by their length, without lowercasing.
    if (length !== 4 && length !== 12 && length !== 13 && length !== 15) continue
    const name = raw.toLowerCase()
    const j = NAMES.indexOf(name)
    if (j === -1) continue
    if ((seen & (1 << j)) !== 0) return CANONICAL[j]
    seen |= 1 << j
  }
  return undefined
}

/**
 * The first onRequest hook: before the failed-authentication limit and the key
 * check. The 400 is the same whatever the keys are, so it tells nothing about
 * them and needs no counting.
 */
async function singletonHeaders (app: FastifyInstance): Promise<void> {
  app.addHook('onRequest', function refuseRepeatedHeaders (request, _reply, done) {
    const header = repeatedSingleton(request.raw.rawHeaders)
    done(header === undefined ? undefined : validationFailed(`the ${header} header must be sent once`))
  })
}

export default fp(singletonHeaders, { name: 'singleton-headers', dependencies: ['protocol'] })
