import pg from 'pg'

const INT8_OID = 20

/** int8 (bigserial ids, counts) as BigInt: a JavaScript number would round ids above 2^53. */
const types = {
  getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
    oid === INT8_OID ? BigInt : pg.types.getTypeParser(oid, format ?? 'text')) as typeof pg.types.getTypeParser
}

export interface PoolOptions {
  connectionString: string
  max: number
  connectionTimeoutMs: number
  statementTimeoutMs: number
  applicationName?: string
}

export function createPool (options: PoolOptions, onError: (err: Error) => void): pg.Pool {
  const pool = new pg.Pool({
    connectionString: options.connectionString,
    max: options.max,
    // Bounded waits: a request never hangs on an unreachable database or an exhausted pool.
    connectionTimeoutMillis: options.connectionTimeoutMs,
    statement_timeout: options.statementTimeoutMs,
    query_timeout: options.statementTimeoutMs + 1000,
    idleTimeoutMillis: 30000,
    application_name: options.applicationName ?? 'petstore',
    types
  })
  // Without this listener an idle client's error (database restart) crashes the process.
  pool.on('error', onError)
  return pool
}
