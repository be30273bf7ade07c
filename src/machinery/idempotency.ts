import { createHash } from 'node:crypto'
import type pg from 'pg'
import type { Database } from '../db/database.js'

// A key's work is one transaction under a transaction-scoped advisory lock (it holds through a transaction pooler):
// a lost connection rolls it back and frees the key, and a retry finds either nothing or the committed answer.

export interface StoredResponse { status: number, body: string, location: string | null }

export type Outcome<T> =
  | { kind: 'created', result: T, response: StoredResponse }
  | { kind: 'replay', response: StoredResponse }

/** The parts of a body as the operation understood it, in a fixed order; JSON, so no part can run into the next. */
export function digestOf (parts: readonly unknown[]): Buffer {
  return createHash('sha256').update(JSON.stringify(parts)).digest()
}

/** A refusal: nothing was written. */
export class IdempotencyRefusal extends Error {}

export class IdempotencyKeyInUseError extends IdempotencyRefusal {
  readonly retryAfterSeconds = 1
  constructor () {
    super('a request with this Idempotency-Key is still being processed; retry later')
    this.name = 'IdempotencyKeyInUseError'
  }
}

export class IdempotencyKeyReusedError extends IdempotencyRefusal {
  constructor (message = 'this Idempotency-Key was already used with a different request body') {
    super(message)
    this.name = 'IdempotencyKeyReusedError'
  }
}

function lockId (owner: Buffer, key: string): string {
  return createHash('sha256').update(owner).update('\0').update(key).digest().readBigInt64BE(0).toString()
}

/** Expired records deleted per statement: each stays short. */
const EXPIRED_PER_DELETE = 1000

const RECORD = `
SELECT operation, request_hash, response_status, response_body, location, expires_at < now() AS expired
FROM idempotency_keys WHERE key_owner = $1 AND idempotency_key = $2`

const REMEMBER_ANSWER = `
INSERT INTO idempotency_keys
  (key_owner, operation, idempotency_key, request_hash, response_status, response_body, location, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, now() + interval '24 hours')
ON CONFLICT (key_owner, idempotency_key) DO UPDATE
SET operation = EXCLUDED.operation, request_hash = EXCLUDED.request_hash, response_status = EXCLUDED.response_status,
    response_body = EXCLUDED.response_body, location = EXCLUDED.location, expires_at = EXCLUDED.expires_at`

const DELETE_EXPIRED = `
DELETE FROM idempotency_keys WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM idempotency_keys WHERE expires_at < now() LIMIT $1 FOR UPDATE SKIP LOCKED))`

export interface RecordRow {
  operation: string
  request_hash: Buffer
  response_status: number
  response_body: string
  location: string | null
  expired: boolean
}

/** Replay the record's answer, refuse (422), or undefined: do the work (no record, or an expired one). */
export function decide (record: RecordRow | undefined, operation: string, hash: Buffer): StoredResponse | undefined {
  if (record === undefined || record.expired) return undefined
  if (record.operation !== operation) {
    throw new IdempotencyKeyReusedError('this Idempotency-Key was already used for another operation')
  }
  if (!record.request_hash.equals(hash)) throw new IdempotencyKeyReusedError()
  return { status: record.response_status, body: record.response_body, location: record.location }
}

export class IdempotencyStore {
  private cleanupTimer: NodeJS.Timeout | undefined

  constructor (private readonly db: Database) {}

  /** The remembered answer, or `work`'s, committed in one transaction with the record of its response. */
  async execute<T> (owner: Buffer, operation: string, key: string, request: readonly unknown[],
    work: (client: pg.ClientBase) => Promise<{ result: T, response: StoredResponse }>): Promise<Outcome<T>> {
    const hash = digestOf(request)
    // A key already answered (the usual retry) replays without a transaction.
    const remembered = decide((await this.db.query<RecordRow>(RECORD, [owner, key])).rows[0], operation, hash)
    if (remembered !== undefined) return { kind: 'replay', response: remembered }

    return await this.db.transaction(async client => {
      const locked = await client.query<{ locked: boolean }>(
        { text: 'SELECT pg_try_advisory_xact_lock($1) AS locked', values: [lockId(owner, key)] })
      if (locked.rows[0]?.locked !== true) throw new IdempotencyKeyInUseError()
      // Read again under the lock: the record may have been written since.
      const answered = decide((await client.query<RecordRow>(RECORD, [owner, key])).rows[0], operation, hash)
      if (answered !== undefined) return { kind: 'replay', response: answered }
      const { result, response } = await work(client)
      const values = [owner, operation, key, hash, response.status, response.body, response.location]
      await client.query({ text: REMEMBER_ANSWER, values })
      return { kind: 'created', result, response }
    })
  }

  /** In small batches, off the request path. */
  async deleteExpired (batchSize = EXPIRED_PER_DELETE): Promise<number> {
    let total = 0
    for (;;) {
      const { rowCount } = await this.db.query(DELETE_EXPIRED, [batchSize])
      total += rowCount ?? 0
      if ((rowCount ?? 0) < batchSize) return total
    }
  }

  startCleanup (intervalMs: number, onError: (err: unknown) => void): void {
    this.cleanupTimer = setInterval(() => { this.deleteExpired().catch(onError) }, intervalMs).unref()
  }

  stopCleanup (): void {
    clearInterval(this.cleanupTimer)
  }
}
