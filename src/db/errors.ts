// Driver errors, typed once (db/database.ts) for the HTTP layer: nothing here knows of HTTP.

export const POOL_QUEUE_FULL = 'EPOOLQUEUEFULL'
export const DATABASE_IN_RECOVERY = 'EDBINRECOVERY'
export const COMMIT_NOT_REPLICATED = 'ECOMMITNOTREPLICATED'

/** SQLSTATEs (a class, or one code) after which a retry shortly after may succeed, whatever the statement. */
const UNAVAILABLE_SQLSTATES = [
  '08', '28', '3D000', '57P', // connection lost or refused, password rotated, database being restored, shutdown
  '25006', // read-only transaction: a standby in recovery, or default_transaction_read_only
  '26000', '42P05', // prepared statement missing or present: a pooler moved the session to another connection
  '25P03', '25P04', '57014', '40003', '72000', // timeouts (idle, transaction, statement), completion unknown, snapshot
  '40001', '40P01', '55P03', // serialization failure, deadlock, lock not available
  '53', '58' // insufficient resources (connections, disk, memory), system I/O
]
const UNAVAILABLE_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ECONNABORTED', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND',
  'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', POOL_QUEUE_FULL, DATABASE_IN_RECOVERY, COMMIT_NOT_REPLICATED])
const SQLSTATE = /^[0-9A-Z]{5}$/
// pg's own messages for a pool that could not connect in time, a lost connection, its client-side query timeout.
const UNAVAILABLE_MESSAGES = new RegExp(['timeout exceeded when trying to connect', 'Connection terminated',
  'Query read timeout', 'Client has encountered a connection error', 'Connection ended', 'not queryable'
].join('|'), 'i')

function codeOf (err: unknown): string | undefined {
  const code = (err as { code?: unknown } | undefined)?.code
  return typeof code === 'string' ? code : undefined
}

/** The database cannot answer now (unreachable, restarting, read-only, overloaded): the HTTP layer's 503. */
export class DatabaseUnavailableError extends Error {
  override name = 'DatabaseUnavailableError'
  /** The SQLSTATE or error code that classified the failure, if any. */
  readonly reason = codeOf(this.cause)

  constructor (cause: unknown) {
    super('the database is unavailable; retry shortly', { cause })
  }
}

export function isDatabaseUnavailable (err: unknown): boolean {
  if (err instanceof DatabaseUnavailableError) return true
  if (!(err instanceof Error)) return false
  const code = codeOf(err) ?? ''
  if (UNAVAILABLE_CODES.has(code)) return true
  if (SQLSTATE.test(code)) return UNAVAILABLE_SQLSTATES.some(prefix => code.startsWith(prefix))
  return UNAVAILABLE_MESSAGES.test(err.message)
}

/** A row the table's constraints refuse (class 23): `conflict` for unique or exclusion, else `invalid`. */
export class ConstraintViolationError extends Error {
  override name = 'ConstraintViolationError'
  readonly kind: 'conflict' | 'invalid'

  constructor (code: string, cause: Error) {
    super('a constraint of the table refused the row', { cause })
    this.kind = code === '23505' || code === '23P01' ? 'conflict' : 'invalid'
  }
}

/** Unavailable and constraint failures typed, the rest (bugs) as they were. */
export function databaseError (err: unknown): unknown {
  if (err instanceof DatabaseUnavailableError || err instanceof ConstraintViolationError) return err
  const code = codeOf(err) ?? ''
  if (err instanceof Error && /^23[0-9A-Z]{3}$/.test(code)) return new ConstraintViolationError(code, err)
  return isDatabaseUnavailable(err) ? new DatabaseUnavailableError(err) : err
}
