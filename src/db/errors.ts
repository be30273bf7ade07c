// Driver errors, typed once (db/database.ts) for the HTTP layer: nothing here knows of HTTP.

export const POOL_QUEUE_FULL = 'EPOOLQUEUEFULL'
export const DATABASE_IN_RECOVERY = 'EDBINRECOVERY'
export const COMMIT_NOT_REPLICATED = 'ECOMMITNOTREPLICATED'

/** SQLSTATEs (a class, or one code) after which a retry shortly after may succeed, whatever the statement. */
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
const UNAVAILABLE_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ECONNABORTED', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND',
  'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', POOL_QUEUE_FULL, DATABASE_IN_RECOVERY, COMMIT_NOT_REPLICATED])
const SQLSTATE = /^[0-9A-Z]{5}$/
// pg's own messages for a pool that could not connect in time, a lost connection, its client-side query timeout.
const UNAVAILABLE_MESSAGES = new RegExp(['timeout exceeded when trying to connect', 'Connection terminated',
  'Query read timeout', 'Client has encountered a connection error', 'Connection ended', 'not queryable'
].join('|'), 'i')

/** The database cannot answer now (unreachable, restarting, read-only, overloaded): the HTTP layer's 503. */
export class DatabaseUnavailableError extends Error {
  /** The SQLSTATE or error code that classified the failure, if any. */
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

/** A row the table's constraints refuse (class 23): `conflict` for unique or exclusion, else `invalid`. */
export class ConstraintViolationError extends Error {
  readonly kind: 'conflict' | 'invalid'

  constructor (code: string, cause: Error) {
    super('a constraint of the table refused the row', { cause })
    this.name = 'ConstraintViolationError'
    this.kind = code === '23505' || code === '23P01' ? 'conflict' : 'invalid'
  }
}

/** Unavailable and constraint failures typed, the rest (bugs) as they were. */
export function databaseError (err: unknown): unknown {
  if (err instanceof DatabaseUnavailableError || err instanceof ConstraintViolationError) return err
  const code = (err as { code?: unknown } | undefined)?.code
  if (err instanceof Error && typeof code === 'string' && /^23[0-9A-Z]{3}$/.test(code)) {
    return new ConstraintViolationError(code, err)
  }
  return isDatabaseUnavailable(err) ? new DatabaseUnavailableError(err) : err
}
