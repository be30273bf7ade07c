import { ApiError, serviceUnavailable } from '../http/errors.js'
import { POOL_QUEUE_FULL } from './pool.js'
import { COMMIT_NOT_REPLICATED, DATABASE_IN_RECOVERY } from './servers.js'

/*
 * The one place where driver errors become the service's errors. Anything that
 * means "the database cannot answer now" is a 503 the client may retry;
 * everything else stays an unexpected error (a 500, logged). The
 * classification (isDatabaseUnavailable) knows nothing of HTTP; only the two
 * functions below it do.
 */

/**
 * SQLSTATEs (a class by its first characters, or one code) that mean the
 * database cannot serve now, whatever the statement: it is unreachable,
 * restarting, failing over, read-only, out of resources, or a pooler lost a
 * session's state. A retry shortly after may succeed.
 */
const UNAVAILABLE_SQLSTATES = [
  '08', // connection exception
  '25006', // read-only transaction: a standby in recovery, or default_transaction_read_only
  '25P03', // idle-in-transaction session timeout ended the session
  '25P04', // transaction timeout ended the session
  '26000', // prepared statement does not exist: a pooler moved the session to another server connection
  '28', // invalid authorization: a rotated password
  '3D000', // database does not exist: being restored or recreated
  '40001', // serialization failure
  '40003', // statement completion unknown
  '40P01', // deadlock detected
  '42P05', // prepared statement already exists: a pooler moved the session to another server connection
  '53', // insufficient resources: too many connections, disk full, out of memory
  '55P03', // lock not available
  '57014', // query canceled: statement_timeout
  '57P', // operator intervention: admin or crash shutdown, cannot connect now
  '58', // system error: I/O
  '72000' // snapshot too old
]
// Node's socket errors and the service's own (db/pool.ts, db/servers.ts).
const UNAVAILABLE_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ECONNABORTED', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', POOL_QUEUE_FULL, DATABASE_IN_RECOVERY, COMMIT_NOT_REPLICATED])
const SQLSTATE = /^[0-9A-Z]{5}$/

export function isDatabaseUnavailable (err: unknown): boolean {
  if (!(err instanceof Error) || err instanceof ApiError) return false
  const code = (err as { code?: unknown }).code
  if (typeof code === 'string') {
    if (UNAVAILABLE_CODES.has(code)) return true
    if (SQLSTATE.test(code)) return UNAVAILABLE_SQLSTATES.some(prefix => code.startsWith(prefix))
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
