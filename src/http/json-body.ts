import { isUtf8 } from 'node:buffer'
import type { FastifyInstance } from 'fastify'
import { ApiError, errorForStatus, malformedJson, validationFailed } from './errors.js'
import { interoperabilityProblem } from './interoperable-json.js'

const CHARSET = /;\s*charset\s*=\s*"?([^";\s]*)"?/i

/**
 * The only body parser: application/json in UTF-8. Fastify's own parser decodes
 * invalid UTF-8 to U+FFFD silently; the contract wants a 400 instead, so the
 * body is read as bytes and checked before JSON.parse. Other media types: 415.
 * JSON that other parsers would read differently (duplicate names...) is a 400.
 * A body is read as sent: any Content-Encoding but identity is 415 (RFC 9110 15.5.16).
 */
export function registerJsonBodyParser (app: FastifyInstance): void {
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (request, body: Buffer, done) => {
    const codings = request.headers['content-encoding']?.split(',').map(coding => coding.trim().toLowerCase()) ?? []
    if (codings.some(coding => coding !== 'identity' && coding !== '')) {
      done(new ApiError(415, 'UNSUPPORTED_MEDIA_TYPE', 'Content-Encoding must be identity: send the body uncompressed',
        { 'accept-encoding': 'identity' }), undefined)
      return
    }
    const charset = CHARSET.exec(request.headers['content-type'] ?? '')?.[1]?.toLowerCase()
    if (charset !== undefined && charset !== 'utf-8' && charset !== 'utf8') {
      done(errorForStatus(415, 'Content-Type charset must be utf-8'), undefined)
      return
    }
    if (body.length === 0) {
      done(malformedJson('request body is empty; send a JSON object'), undefined)
      return
    }
    if (!isUtf8(body)) {
      done(malformedJson('request body is not valid UTF-8'), undefined)
      return
    }
    const text = body.toString('utf8')
    let value: unknown
    try {
      // JSON.parse makes "__proto__" an own member (schema validation rejects it), never a prototype.
      value = JSON.parse(text)
    } catch {
      done(malformedJson('request body is not valid JSON'), undefined)
      return
    }
    const problem = interoperabilityProblem(text)
    done(problem === undefined ? null : validationFailed(problem), problem === undefined ? value : undefined)
  })
}
