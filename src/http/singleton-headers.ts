import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { validationFailed } from './errors.js'

// Headers RFC 9110 allows once and the service reads: sent twice, Node keeps one Authorization, Content-Type or Host
// and joins two Idempotency-Keys or X-Request-Ids, and a proxy in front may pick the other. docs/hardening.md.
const CANONICAL = ['Authorization', 'Content-Type', 'Host', 'Idempotency-Key', 'X-Request-Id']
const NAMES = CANONICAL.map(name => name.toLowerCase())

function repeatedSingleton (rawHeaders: string[]): string | undefined {
  let seen = 0 // bit j: NAMES[j] was sent
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const raw = rawHeaders[i] as string
    const length = raw.length
    // Every request pays for this loop: most names are ruled out by their length, without lowercasing.
    if (length !== 4 && length !== 12 && length !== 13 && length !== 15) continue
    const j = NAMES.indexOf(raw.toLowerCase())
    if (j === -1) continue
    if ((seen & (1 << j)) !== 0) return CANONICAL[j]
    seen |= 1 << j
  }
  return undefined
}

// Before the failed-authentication limit: the 400 is the same whatever the keys are, so it needs no counting.
async function singletonHeaders (app: FastifyInstance): Promise<void> {
  app.addHook('onRequest', function refuseRepeatedHeaders (request, _reply, done) {
    const header = repeatedSingleton(request.raw.rawHeaders)
    done(header === undefined ? undefined : validationFailed(`the ${header} header must be sent once`))
  })
}

export default fp(singletonHeaders, { name: 'singleton-headers', dependencies: ['protocol'] })
