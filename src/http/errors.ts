import { Type, type Static, type TUnsafe } from 'typebox'
import { ref } from './schemas.js'

/** The error code of each status (docs/api.md, "Status and error codes"), Node's own answers included. */
export const ErrorCodes = {
  400: 'VALIDATION_FAILED',
  401: 'UNAUTHORIZED',
  404: 'NOT_FOUND',
  405: 'METHOD_NOT_ALLOWED',
  408: 'REQUEST_TIMEOUT',
  409: 'IDEMPOTENCY_KEY_IN_USE',
  413: 'PAYLOAD_TOO_LARGE',
  414: 'URI_TOO_LONG',
  415: 'UNSUPPORTED_MEDIA_TYPE',
  417: 'EXPECTATION_FAILED',
  422: 'IDEMPOTENCY_KEY_REUSED',
  429: 'RATE_LIMITED',
  431: 'HEADERS_TOO_LARGE',
  500: 'INTERNAL_ERROR',
  501: 'NOT_IMPLEMENTED',
  503: 'SERVICE_UNAVAILABLE',
  505: 'HTTP_VERSION_NOT_SUPPORTED'
} as const

export const MALFORMED_JSON = 'MALFORMED_JSON'
/** 409 for a value a unique constraint of the table already holds (the resource's own rule). */
export const CONFLICT = 'CONFLICT'

export type ErrorCode = (typeof ErrorCodes)[keyof typeof ErrorCodes] | typeof MALFORMED_JSON | typeof CONFLICT

const allCodes: ErrorCode[] = [...new Set<ErrorCode>([...Object.values(ErrorCodes), MALFORMED_JSON, CONFLICT])]

export const ErrorSchema = Type.Object({
  code: Type.Unsafe<ErrorCode>({ type: 'string', enum: allCodes, description: 'Machine-readable error code' }),
  message: Type.String({ description: 'Human-readable explanation; never internals' }),
  status: Type.Integer({ description: 'Equal to the HTTP status of the response', minimum: 400, maximum: 599 })
}, { $id: 'Error', title: 'Error', additionalProperties: false })

export type ErrorBody = Static<typeof ErrorSchema>

/** Every failure the service produces on purpose is one of these. */
export class ApiError extends Error {
  readonly status: number
  readonly code: ErrorCode
  readonly headers: Record<string, string>

  constructor (status: number, code: ErrorCode, message: string, headers: Record<string, string> = {}) {
    super(message)
    this.name = 'ApiError'
    this.status = status
    this.code = code
    this.headers = headers
  }

  toBody (): ErrorBody {
    return { code: this.code, message: this.message, status: this.status }
  }
}

export const validationFailed = (message: string): ApiError =>
  new ApiError(400, 'VALIDATION_FAILED', message)

export const malformedJson = (message: string): ApiError =>
  new ApiError(400, MALFORMED_JSON, message)

export const notFound = (message: string): ApiError =>
  new ApiError(404, 'NOT_FOUND', message)

export const notImplemented = (message: string): ApiError =>
  new ApiError(501, 'NOT_IMPLEMENTED', message)

/** Retry-After is in seconds; one second is long enough for a pool or a restarting database. */
export const serviceUnavailable = (message: string, retryAfterSeconds = 1): ApiError =>
  new ApiError(503, 'SERVICE_UNAVAILABLE', message, { 'retry-after': String(retryAfterSeconds) })

/** The body of a status the service did not produce on purpose (framework, plugin, Node). */
export function errorForStatus (status: number, message: string, headers: Record<string, string> = {}): ApiError {
  const code = (ErrorCodes as Record<number, ErrorCode>)[status]
  if (code !== undefined) return new ApiError(status, code, message, headers)
  if (status >= 500) return new ApiError(500, 'INTERNAL_ERROR', 'internal error')
  return new ApiError(400, 'VALIDATION_FAILED', message)
}

export type ErrorStatus = keyof typeof ErrorCodes

/** What each documented status means, in the OpenAPI document. */
const RESPONSE_DESCRIPTIONS: Record<ErrorStatus, string> = {
  400: 'The request breaks a rule: the message names the field or problem',
  401: 'Missing or invalid API key',
  404: 'No such resource',
  405: 'Method not allowed on this path (see Allow)',
  408: 'The request took too long to arrive',
  409: 'The same Idempotency-Key is still being processed (see Retry-After)',
  413: 'Request body is larger than the limit',
  414: 'The request URL is too long',
  415: 'Request body is not application/json, or has a Content-Encoding other than identity',
  417: 'The Expect header asks for something other than 100-continue',
  422: 'The Idempotency-Key was used with a different body',
  429: 'Too many requests (see Retry-After and RateLimit)',
  431: 'Request headers are too large',
  500: 'Unexpected error',
  501: 'Not implemented yet',
  503: 'Database unreachable, shutting down or overloaded (see Retry-After)',
  505: 'Only HTTP/1.0 and HTTP/1.1 are supported'
}

/** What the service answers for each status, unless an operation names its own (test/openapi.test.ts compares them with live answers). */
const EXAMPLE_MESSAGES: Record<ErrorStatus, string> = {
  400: 'the request URL is not valid',
  401: 'an API key is required: send Authorization: Bearer <key>',
  404: 'no route for GET /v1/nowhere',
  405: 'DELETE is not allowed on /v1/categories; use GET, POST',
  408: 'the request took too long to arrive',
  409: 'a request with this Idempotency-Key is still being processed; retry later',
  413: 'request body is larger than the limit',
  414: 'the request URL is too long',
  415: 'Content-Type must be application/json',
  417: 'the only expectation supported is 100-continue',
  422: 'this Idempotency-Key was already used with a different request body',
  429: 'too many failed authentication attempts from this address; retry in 42 s',
  431: 'request headers are too large',
  500: 'internal error',
  501: 'not implemented yet',
  503: 'the database is unavailable; retry shortly',
  505: 'only HTTP/1.0 and HTTP/1.1 are supported'
}

/** An error response in a route's schema: the Error body, with its example for the OpenAPI document. */
export interface ErrorResponse {
  description: string
  content: { 'application/json': { schema: TUnsafe<ErrorBody>, example?: ErrorBody, examples?: Record<string, { summary: string, value: ErrorBody }> } }
}

/** An example of its own for an operation's status: a message, or several bodies (e.g. a 400 of two codes). */
export type ErrorExample = string | Array<{ summary: string, body: ErrorBody }>

/**
 * The error responses of a route's schema: each status answers with the Error schema and a true example
 * (the status's own, or the operation's from `examples`).
 */
export function errorResponses (statuses: ErrorStatus[], examples: Partial<Record<ErrorStatus, ErrorExample>> = {}): Record<number, ErrorResponse> {
  return Object.fromEntries(statuses.map(status => {
    const example = examples[status] ?? EXAMPLE_MESSAGES[status]
    const shown = typeof example === 'string'
      ? { example: { code: ErrorCodes[status], message: example, status } }
      : { examples: Object.fromEntries(example.map(({ summary, body }) => [body.code, { summary, value: body }])) }
    return [status, { description: RESPONSE_DESCRIPTIONS[status], content: { 'application/json': { schema: ref(ErrorSchema), ...shown } } }]
  }))
}
