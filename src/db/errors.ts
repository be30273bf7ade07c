import { POOL_QUEUE_FULL } from './pool.js'
import { COMMIT_NOT_REPLICATED, DATABASE_IN_RECOVERY } from './servers.js'

/*
 * The one place where driver errors become the service's errors. Anything that
 * means "the database cannot answer now" becomes a DatabaseUnavailableError (the
 * HTTP error handler answers it with a 503 and Retry-After: the client may retry);
 * everything else stays as it was thrown (an unexpected error). Nothing here
 * knows of HTTP.
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

/** The database cannot answer now (unreachable, restarting, read-only, overloaded...); a retry shortly after may succeed. */
export class DatabaseUnavailableError extends Error {
  /** The SQLSTATE or error code that classified the failure, when it had one (else the driver's message told). */
  readonly reason: string | undefined

  constructor (cause: unknown) {
    super('the database is unavailable; retry shortly', { cause })
    this.name = 'DatabaseUnavailableError'
    const code = (cause as { code?: unknown } | undefined)?.code
    this.reason = typeof code === 'string' ? code : undefined
  }
}

export function isDatabaseUnavailable (err: unknown): boolean {
  if (err instanceof DatabaseUnavailableError) return true
  if (!(err instanceof Error)) return false
  const code = (err as { code?: unknown }).code
  if (typeof code === 'string') {
    if (UNAVAILABLE_CODES.has(code)) return true
    if (SQLSTATE.test(code)) return UNAVAILABLE_SQLSTATES.some(prefix => code.startsWith(prefix))
  }
  // pg's own messages for a pool that could not connect in time, a lost connection and a query timeout
  return /timeout exceeded when trying to connect|Connection terminated|Query read timeout|Client has encountered a connection error|Connection ended|not queryable/i.test(err.message)
}

/** Runs a database call and turns "unavailable" failures into a DatabaseUnavailableError. */
export async function withDatabase<T> (call: () => Promise<T>): Promise<T> {
  try {
    return await call()
  } catch (err) {
    if (err instanceof DatabaseUnavailableError || !isDatabaseUnavailable(err)) throw err
    throw new DatabaseUnavailableError(err)
  }
}
