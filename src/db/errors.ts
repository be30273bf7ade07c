/*
 * Which driver errors mean "the database cannot answer now". db/database.ts turns
 * them into a DatabaseUnavailableError (the HTTP error handler answers 503 with
 * Retry-After: the client may retry); anything else stays as thrown (a bug: 500).
 * Nothing here knows of HTTP.
 */

/** The pool's wait queue is full (DB_POOL_MAX_WAITING): overload is answered at once, not queued without bound. */
export const POOL_QUEUE_FULL = 'EPOOLQUEUEFULL'
/** The server reached is a standby in recovery (db/servers.ts). */
export const DATABASE_IN_RECOVERY = 'EDBINRECOVERY'
/** A commit the synchronous standby did not confirm: committed on the primary alone, its outcome unknown (db/servers.ts). */
export const COMMIT_NOT_REPLICATED = 'ECOMMITNOTREPLICATED'

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
const UNAVAILABLE_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ECONNABORTED', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', POOL_QUEUE_FULL, DATABASE_IN_RECOVERY, COMMIT_NOT_REPLICATED])
const SQLSTATE = /^[0-9A-Z]{5}$/
// pg's own messages for a pool that could not connect in time, a lost connection and its client-side query timeout.
const UNAVAILABLE_MESSAGES = /timeout exceeded when trying to connect|Connection terminated|Query read timeout|Client has encountered a connection error|Connection ended|not queryable/i

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
  return UNAVAILABLE_MESSAGES.test(err.message)
}

/**
 * A row the table's constraints refuse (SQLSTATE class 23): `conflict` for a unique or exclusion constraint
 * (another row holds the value), `invalid` for the others (check, not-null, foreign key).
 */
export class ConstraintViolationError extends Error {
  readonly kind: 'conflict' | 'invalid'

  constructor (code: string, cause: Error) {
    super('a constraint of the table refused the row', { cause })
    this.name = 'ConstraintViolationError'
    this.kind = code === '23505' || code === '23P01' ? 'conflict' : 'invalid'
  }
}

/** The error a caller of db/database.ts sees: unavailable and constraint failures typed, the rest as they were. */
export function databaseError (err: unknown): unknown {
  if (err instanceof DatabaseUnavailableError || err instanceof ConstraintViolationError) return err
  const code = (err as { code?: unknown } | undefined)?.code
  if (err instanceof Error && typeof code === 'string' && /^23[0-9A-Z]{3}$/.test(code)) {
    return new ConstraintViolationError(code, err)
  }
  return isDatabaseUnavailable(err) ? new DatabaseUnavailableError(err) : err
}
