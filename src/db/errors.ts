import { ApiError, serviceUnavailable } from '../http/errors.js'
import { POOL_QUEUE_FULL } from './pool.js'

/*
 * The one place where driver errors become the service's errors. Anything that
 * means "the database cannot answer now" is a 503 the client may retry;
 * everything else stays an unexpected error (a 500, logged).
 */

// connection exception, invalid authorization (rotated password), insufficient resources, operator intervention,
// and a database that does not exist (being restored or recreated): all mean the service cannot reach its data now.
const UNAVAILABLE_SQLSTATE_CLASSES = ['08', '28', '53', '57P', '3D000']
const QUERY_CANCELED = '57014' // statement_timeout
const UNAVAILABLE_NODE_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH'])

export function isDatabaseUnavailable (err: unknown): boolean {
  if (!(err instanceof Error) || err instanceof ApiError) return false
  const code = (err as { code?: unknown }).code
  if (typeof code === 'string') {
    if (code === QUERY_CANCELED || code === POOL_QUEUE_FULL || UNAVAILABLE_NODE_CODES.has(code)) return true
    if (/^[0-9A-Z]{5}$/.test(code)) return UNAVAILABLE_SQLSTATE_CLASSES.some(prefix => code.startsWith(prefix))
  }
  // pg's own messages for a pool that could not connect in time, a lost connection and a query timeout
  return /timeout exceeded when trying to connect|Connection terminated|Query read timeout|Client has encountered a connection error|Connection ended|not queryable/i.test(err.message)
}

/** Runs a database call and turns "unavailable" failures into a 503 ApiError. */
export async function withDatabase<T> (call: () => Promise<T>): Promise<T> {
  try {
    return await call()
  } catch (err) {
    if (isDatabaseUnavailable(err)) throw databaseUnavailable(err)
    throw err
  }
}

export function databaseUnavailable (cause: unknown): ApiError {
  const error = serviceUnavailable('the database is unavailable; retry shortly')
  error.cause = cause
  return error
}
