import { Type, type Static } from 'typebox'
import { ref } from './schemas.js'

/** Each status's code (docs/api.md, "Status and error codes"), and its description and example in the document. */
const STATUSES = {
  400: ['VALIDATION_FAILED', 'The request breaks a rule: the message names the field or problem',
    'the request URL is not valid'],
  401: ['UNAUTHORIZED', 'Missing or invalid API key', 'an API key is required: send Authorization: Bearer <key>'],
  403: ['FORBIDDEN', 'The API key lacks the scope this operation needs (read keys may only list and get)',
    'this API key has the read scope; POST needs a key with the write scope'],
  404: ['NOT_FOUND', 'No such resource', 'no route for GET /v1/nowhere'],
  405: ['METHOD_NOT_ALLOWED', 'Method not allowed on this path (see Allow)',
    'DELETE is not allowed on /v1/categories; use GET, POST'],
  408: ['REQUEST_TIMEOUT', 'The request took too long to arrive', 'the request took too long to arrive'],
  409: ['IDEMPOTENCY_KEY_IN_USE', 'The same Idempotency-Key is still being processed (see Retry-After)',
    'a request with this Idempotency-Key is still being processed; retry later'],
  412: ['PRECONDITION_FAILED', 'If-Match does not name the current ETag: the resource changed since it was read',
    'category 42 has changed since it was read: If-Match does not name its current ETag'],
  413: ['PAYLOAD_TOO_LARGE', 'Request body is larger than the limit', 'request body is larger than the limit'],
  414: ['URI_TOO_LONG', 'The request URL is too long', 'the request URL is too long'],
  415: ['UNSUPPORTED_MEDIA_TYPE', 'Request body is not application/json, or has a Content-Encoding other than identity',
    'Content-Type must be application/json'],
  417: ['EXPECTATION_FAILED', 'The Expect header asks for something other than 100-continue',
    'the only expectation supported is 100-continue'],
  422: ['IDEMPOTENCY_KEY_REUSED', 'The Idempotency-Key was used with a different body',
    'this Idempotency-Key was already used with a different request body'],
  429: ['RATE_LIMITED', 'Too many requests (see Retry-After and RateLimit)',
    'too many failed authentication attempts from this address; retry in 42 s'],
  431: ['HEADERS_TOO_LARGE', 'Request headers are too large', 'request headers are too large'],
  500: ['INTERNAL_ERROR', 'Unexpected error', 'internal error'],
  501: ['NOT_IMPLEMENTED', 'Not implemented yet', 'not implemented yet'],
  503: ['SERVICE_UNAVAILABLE', 'Database unreachable, shutting down or overloaded (see Retry-After)',
    'the database is unavailable; retry shortly'],
  505: ['HTTP_VERSION_NOT_SUPPORTED', 'Only HTTP/1.0 and HTTP/1.1 are supported',
    'only HTTP/1.0 and HTTP/1.1 are supported']
} as const

type ErrorStatus = keyof typeof STATUSES

export const ErrorCodes = Object.fromEntries(Object.entries(STATUSES).map(([status, [code]]) => [status, code])) as
  { [S in ErrorStatus]: (typeof STATUSES)[S][0] }

export const MALFORMED_JSON = 'MALFORMED_JSON'

// CONFLICT: 409 for a value a unique constraint of the table already holds (the resource's own rule).
type ErrorCode = (typeof STATUSES)[ErrorStatus][0] | typeof MALFORMED_JSON | 'CONFLICT'

const allCodes: ErrorCode[] = [...Object.values(STATUSES).map(([code]) => code), MALFORMED_JSON, 'CONFLICT']

export const ErrorSchema = Type.Object({
  code: Type.Unsafe<ErrorCode>({ type: 'string', enum: allCodes, description: 'Machine-readable error code' }),
  message: Type.String({ description: 'Human-readable explanation; never internals' }),
  status: Type.Integer({ description: 'Equal to the HTTP status of the response', minimum: 400, maximum: 599 })
}, { $id: 'Error', title: 'Error', additionalProperties: false })

export type ErrorBody = Static<typeof ErrorSchema>

export class ApiError extends Error {
  constructor (readonly status: number, readonly code: ErrorCode, message: string,
    readonly headers: Record<string, string> = {}) {
    super(message)
    this.name = 'ApiError'
  }

  toBody (): ErrorBody {
    return { code: this.code, message: this.message, status: this.status }
  }
}

export const validationFailed = (message: string): ApiError => new ApiError(400, 'VALIDATION_FAILED', message)
export const malformedJson = (message: string): ApiError => new ApiError(400, MALFORMED_JSON, message)
export const notFound = (message: string): ApiError => new ApiError(404, 'NOT_FOUND', message)
export const notImplemented = (message: string): ApiError => new ApiError(501, 'NOT_IMPLEMENTED', message)
/** One second is long enough for a pool or a restarting database. */
export const serviceUnavailable = (message: string): ApiError =>
  new ApiError(503, 'SERVICE_UNAVAILABLE', message, { 'retry-after': '1' })

/** The body of a status the service did not produce on purpose (framework, plugin, Node). */
export function errorForStatus (status: number, message: string, headers: Record<string, string> = {}): ApiError {
  if (status in STATUSES) return new ApiError(status, STATUSES[status as ErrorStatus][0], message, headers)
  if (status >= 500) return new ApiError(500, 'INTERNAL_ERROR', 'internal error')
  return validationFailed(message)
}

// A message, or several bodies (a 400 of two codes).
type ErrorExample = string | Array<[summary: string, code: ErrorCode, message: string]>

export function errorResponses (statuses: ErrorStatus[], examples: Partial<Record<ErrorStatus, ErrorExample>> = {}) {
  return Object.fromEntries(statuses.map(status => {
    const [code, description, message] = STATUSES[status]
    const example = examples[status] ?? message
    const shown = typeof example === 'string'
      ? { example: { code, message: example, status } }
      : {
          examples: Object.fromEntries(example.map(([summary, code, message]) =>
            [code, { summary, value: { code, message, status } }]))
        }
    return [status, { description, content: { 'application/json': { schema: ref(ErrorSchema), ...shown } } }]
  }))
}
