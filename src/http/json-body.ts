import { isUtf8 } from 'node:buffer'
import type { FastifyInstance, FastifyRequest } from 'fastify'
import fp from 'fastify-plugin'
import { ApiError, errorForStatus, malformedJson, validationFailed } from './errors.js'
import { interoperabilityProblem } from './interoperable-json.js'

const CHARSET = /;\s*charset\s*=\s*"?([^";\s]*)"?/i

// Read as bytes: Fastify's own parser turns invalid UTF-8 into U+FFFD silently, where the contract wants a 400.
export async function parseJsonBody ({ headers }: FastifyRequest, body: Buffer): Promise<unknown> {
  // A body is read as sent: any coding but identity is 415 (RFC 9110 15.5.16).
  const codings = headers['content-encoding']?.split(',').map(coding => coding.trim().toLowerCase()) ?? []
  if (codings.some(coding => coding !== 'identity' && coding !== '')) {
    throw new ApiError(415, 'UNSUPPORTED_MEDIA_TYPE', 'Content-Encoding must be identity: send the body uncompressed',
      { 'accept-encoding': 'identity' })
  }
  const charset = CHARSET.exec(headers['content-type'] ?? '')?.[1]?.toLowerCase()
  if (charset !== undefined && charset !== 'utf-8' && charset !== 'utf8') {
    throw errorForStatus(415, 'Content-Type charset must be utf-8')
  }
  if (body.length === 0) throw malformedJson('request body is empty; send a JSON object')
  if (!isUtf8(body)) throw malformedJson('request body is not valid UTF-8')
  const text = body.toString('utf8')
  let value: unknown
  try {
    // JSON.parse makes "__proto__" an own member (schema validation rejects it), never a prototype.
    value = JSON.parse(text)
  } catch {
    throw malformedJson('request body is not valid JSON')
  }
  const problem = interoperabilityProblem(text)
  if (problem !== undefined) throw validationFailed(problem)
  return value
}

/** The only body parser: other media types are 415. */
export default fp(async function jsonBody (app: FastifyInstance): Promise<void> {
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, parseJsonBody)
}, { name: 'json-body' })
