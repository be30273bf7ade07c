import { STATUS_CODES } from 'node:http'
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest, FastifySchemaValidationError } from 'fastify'
import fp from 'fastify-plugin'
import { ConstraintViolationError, DatabaseUnavailableError } from '../db/errors.js'
import { IdempotencyKeyInUseError, IdempotencyKeyReusedError } from '../machinery/idempotency.js'
import { patternRules } from '../shared/text-rules.js'
import { ApiError, ErrorSchema, errorForStatus, notFound, serviceUnavailable, validationFailed } from './errors.js'

// Every failure after a request exists becomes the Error body here; what Node refuses before that, in protocol.ts.

function describeValidation (error: FastifySchemaValidationError, context: string): string {
  const field = error.instancePath.replace(/^\//, '').replace(/\//g, '.')
  const subject = field === '' ? (context === 'body' ? 'request body' : context) : `'${field}'`
  const p = error.params
  switch (error.keyword) {
    case 'additionalProperties':
      return `${context === 'body' ? 'request body' : context} has an unknown member '${String(p.additionalProperty)}'`
    case 'required':
      return `${subject} is missing the required member '${String(p.missingProperty)}'`
    case 'type':
      return field === '' && context === 'body'
        ? 'request body must be a JSON object'
        : `${subject} must be of type ${[p.type].flat().join(' or ')}`
    case 'minLength':
      return `${subject} must be at least ${String(p.limit)} character${p.limit === 1 ? '' : 's'} long`
    case 'maxLength':
      return `${subject} must be at most ${String(p.limit)} characters long`
    case 'pattern':
      return `${subject} ${patternRules[String(p.pattern)] ?? 'has an invalid format'}`
    default:
      return `${subject} ${error.message ?? 'is invalid'}`
  }
}

// Fastify's errors whose own status or message is not the contract's.
const FRAMEWORK_ERRORS = new Map<string, [status: number, message: string]>([
  ['FST_ERR_CTP_INVALID_MEDIA_TYPE', [415, 'Content-Type must be application/json']],
  ['FST_ERR_CTP_INVALID_CONTENT_LENGTH', [400, 'Content-Length does not match the request body']],
  ['FST_ERR_CTP_BODY_TOO_LARGE', [413, 'request body is larger than the limit']],
  ['FST_ERR_BAD_URL', [400, 'the request URL is not valid']],
  ['FST_ERR_MAX_PARAM_LENGTH', [400, 'a path parameter is too long']]
])

function toApiError (err: unknown): ApiError {
  if (err instanceof ApiError) return err
  if (err instanceof DatabaseUnavailableError) return serviceUnavailable(err.message)
  if (err instanceof ConstraintViolationError) {
    return err.kind === 'conflict'
      ? new ApiError(409, 'CONFLICT', 'a stored row already holds a value of this request that must be unique')
      : validationFailed('the request breaks a rule of the stored data')
  }
  if (err instanceof IdempotencyKeyInUseError) {
    return new ApiError(409, 'IDEMPOTENCY_KEY_IN_USE', err.message, { 'retry-after': String(err.retryAfterSeconds) })
  }
  if (err instanceof IdempotencyKeyReusedError) return new ApiError(422, 'IDEMPOTENCY_KEY_REUSED', err.message)
  const error = err as FastifyError
  const [invalid] = error.validation ?? []
  if (invalid !== undefined) return validationFailed(describeValidation(invalid, error.validationContext ?? 'body'))
  const known = FRAMEWORK_ERRORS.get(error.code)
  if (known !== undefined) return errorForStatus(...known)
  const status = typeof error.statusCode === 'number' ? error.statusCode : 500
  if (status >= 400 && status < 500) return errorForStatus(status, STATUS_CODES[status] ?? 'bad request')
  return errorForStatus(500, 'internal error')
}

function sendError (reply: FastifyReply, error: ApiError): FastifyReply {
  return reply.code(error.status).headers(error.headers).send(error.toBody())
}

export default fp(async function errors (app: FastifyInstance): Promise<void> {
  app.addSchema(ErrorSchema)
  app.setErrorHandler((err: unknown, request: FastifyRequest, reply: FastifyReply) => {
    const error = toApiError(err)
    if (error.code === 'INTERNAL_ERROR') {
      request.log.error({ err }, 'unexpected error')
    } else if (err instanceof DatabaseUnavailableError) {
      // The database failure behind a 503 is worth a warning; an expected 503 (draining, not migrated) is not.
      request.log.warn({ err: err.cause, reason: err.reason }, err.message)
    }
    return sendError(reply, error)
  })

  app.setNotFoundHandler((request: FastifyRequest, reply: FastifyReply) =>
    sendError(reply, notFound(`no route for ${request.method} ${request.url.split('?')[0] ?? ''}`)))
}, { name: 'errors' })

// A URL Fastify cannot decode (or an over-long path parameter) is refused before routing, outside the error handler.
export function frameworkErrors (error: FastifyError, _request: FastifyRequest, reply: FastifyReply): FastifyReply {
  return sendError(reply, toApiError(error))
}
