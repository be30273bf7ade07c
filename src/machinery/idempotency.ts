import { createHash, randomUUID } from 'node:crypto'
import pg from 'pg'
import { withDatabase } from '../db/errors.js'
import { confirmReplicated } from '../db/servers.js'

/*
 * Idempotency-Key for any operation that creates, as the contract says: scoped
 * to the API key, remembered 24 hours in PostgreSQL (so every instance agrees),
 * the same key and body for the same operation replays the first answer; a
 * different body, or another operation, is refused (IdempotencyKeyReusedError:
 * 422 over HTTP: a key used for one operation never replays another's answer),
 * a request still running too (IdempotencyKeyInUseError: 409). A record names
 * its operation; the key stays unique per owner, so the previous version's
 * statements keep working during a rolling deploy (migrations/1763985600000).
 *
 * A key's work is one transaction: it takes a transaction-scoped advisory lock
 * on the key (held elsewhere: 409 at once), reads the key's record, and
 * commits the created row with the record of its answer. Nothing about a
 * request in flight is ever committed, so nothing can outlive it: when its
 * connection is lost (backend terminated, failover, network), PostgreSQL rolls
 * the transaction back and frees the lock, and the retry starts afresh; if the
 * COMMIT went through before the answer was lost, the retry finds the record
 * and replays it. No clean-up is needed after a failure, when the database may
 * well be unreachable. The lock is transaction-scoped, so it also holds
 * through a transaction-pooling PgBouncer.
 */

const REMEMBER = '24 hours'
const RETRY_AFTER_SECONDS = 1

export interface StoredResponse { status: number, body: string, location: string | null }

export type Outcome<T> =
  | { kind: 'created', result: T }
  | { kind: 'replay', response: StoredResponse }

/**
 * A request body as the operation understood it, for `execute`'s hash: the parts in a fixed order (the same
 * object sent with other spacing or member order is the same body). JSON, so no part can run into the next.
 */
export function digestOf (parts: readonly unknown[]): Buffer {
  return createHash('sha256').update(JSON.stringify(parts)).digest()
}

/** The key is held by a request still running (or an earlier version's claim not yet lapsed): retry later. */
export class IdempotencyKeyInUseError extends Error {
  readonly retryAfterSeconds = RETRY_AFTER_SECONDS
  constructor () {
    super('a request with this Idempotency-Key is still being processed; retry later')
    this.name = 'IdempotencyKeyInUseError'
  }
}

/** The key was used with a different request body, or for another operation. */
export class IdempotencyKeyReusedError extends Error {
  constructor (message = 'this Idempotency-Key was already used with a different request body') {
    super(message)
    this.name = 'IdempotencyKeyReusedError'
  }
}

/** A refusal: nothing was written. */
export const isIdempotencyRefusal = (err: unknown): boolean => err instanceof IdempotencyKeyInUseError || err instanceof IdempotencyKeyReusedError

/** The advisory lock of one key of one owner: 64 bits of a digest of both (the lock earlier versions take too). */
function lockId (owner: Buffer, key: string): string {
  const digest = createHash('sha256').update(owner).update('\0').update(key).digest()
  return digest.readBigInt64BE(0).toString()
}

const RECORD = `
SELECT operation, request_hash, state, response_status, response_body, location, expires_at < now() AS expired, locked_until < now() AS lapsed
FROM idempotency_keys WHERE key_owner = $1 AND idempotency_key = $2`

// state 'running' and locked_until belong to records of earlier versions, which committed a claim before the work.
const REMEMBER_ANSWER = `
INSERT INTO idempotency_keys (key_owner, operation, idempotency_key, request_hash, state, claim_token, locked_until, response_status, response_body, location, expires_at)
VALUES ($1, $2, $3, $4, 'done', $5, now(), $6, $7, $8, now() + interval '${REMEMBER}')
ON CONFLICT (key_owner, idempotency_key) DO UPDATE
SET operation = EXCLUDED.operation, request_hash = EXCLUDED.request_hash, state = 'done', claim_token = EXCLUDED.claim_token, locked_until = EXCLUDED.locked_until,
    response_status = EXCLUDED.response_status, response_body = EXCLUDED.response_body, location = EXCLUDED.location, expires_at = EXCLUDED.expires_at`

/** A key's record as read (the columns `decide` needs). */
export interface RecordRow { operation: string, request_hash: Buffer, state: 'running' | 'done', response_status: number | null, response_body: string | null, location: string | null, expired: boolean, lapsed: boolean }

const LOCK_NOT_AVAILABLE = '55P03'

const keyInUse = (): IdempotencyKeyInUseError => new IdempotencyKeyInUseError()

/** What a key's record says: replay its answer, refuse (409, 422), or do the work (no record, or one that no longer binds). */
export function decide (record: RecordRow | undefined, operation: string, hash: Buffer): StoredResponse | undefined {
  if (record === undefined || record.expired) return undefined
  if (record.operation !== operation) throw new IdempotencyKeyReusedError('this Idempotency-Key was already used for another operation')
  if (!record.request_hash.equals(hash)) {
    throw new IdempotencyKeyReusedError()
  }
  if (record.state === 'done') return { status: record.response_status ?? 201, body: record.response_body ?? '', location: record.location }
  // A claim of an earlier version: still held, or its holder died and the same body takes it over.
  if (!record.lapsed) throw keyInUse()
  return undefined
}

export class IdempotencyStore {
  private cleanupTimer: NodeJS.Timeout | undefined

  constructor (private readonly pool: pg.Pool) {}

  /**
   * The answer already remembered for this key (replay, 409, 422), or else
   * `work`'s, committed in one transaction with the record of its response:
   * both exist or neither does.
   */
  async execute<T> (owner: Buffer, operation: string, key: string, hash: Buffer, work: (client: pg.PoolClient) => Promise<{ result: T, response: StoredResponse }>): Promise<Outcome<T>> {
    // A key already answered (the usual retry) replays without a transaction.
    const { rows } = await withDatabase(async () => await this.pool.query<RecordRow>({ text: RECORD, values: [owner, key] }))
    const remembered = decide(rows[0], operation, hash)
    if (remembered !== undefined) return { kind: 'replay', response: remembered }

    return await withDatabase(async () => {
      const client = await this.pool.connect()
      let broken: Error | undefined
      try {
        await client.query('BEGIN')
        const locked = await client.query<{ locked: boolean }>({ text: 'SELECT pg_try_advisory_xact_lock($1) AS locked', values: [lockId(owner, key)] })
        if (locked.rows[0]?.locked !== true) throw keyInUse()
        // Read again under the lock: the record may have been written since. NOWAIT: an earlier version's holder has it locked.
        const current = await client.query<RecordRow>({ text: `${RECORD} FOR UPDATE NOWAIT`, values: [owner, key] })
          .catch((err: unknown) => { throw (err as { code?: unknown }).code === LOCK_NOT_AVAILABLE ? keyInUse() : err })
        const answered = decide(current.rows[0], operation, hash)
        if (answered !== undefined) {
          await client.query('ROLLBACK')
          return { kind: 'replay', response: answered }
        }
        const { result, response } = await work(client)
        await client.query({ text: REMEMBER_ANSWER, values: [owner, operation, key, hash, randomUUID(), response.status, response.body, response.location] })
        await client.query('COMMIT')
        confirmReplicated(client)
        return { kind: 'created', result }
      } catch (err) {
        // The server answered (with an error, or we refused): roll back and keep the connection. Otherwise (a timeout,
        // a lost connection, a commit the synchronous standby never confirmed) its state is unknown: close it.
        if (isIdempotencyRefusal(err) || err instanceof pg.DatabaseError) await client.query('ROLLBACK').catch((rollbackError: Error) => { broken = rollbackError })
        else broken = err as Error
        throw err
      } finally {
        client.release(broken)
      }
    })
  }

  /** Deletes expired records in small batches, off the request path. */
  async deleteExpired (batchSize = 1000): Promise<number> {
    let total = 0
    for (;;) {
      const { rowCount } = await this.pool.query(
        'DELETE FROM idempotency_keys WHERE ctid = ANY (ARRAY(SELECT ctid FROM idempotency_keys WHERE expires_at < now() LIMIT $1 FOR UPDATE SKIP LOCKED))',
        [batchSize])
      total += rowCount ?? 0
      if ((rowCount ?? 0) < batchSize) return total
    }
  }

  startCleanup (intervalMs: number, onError: (err: unknown) => void): void {
    this.cleanupTimer = setInterval(() => { this.deleteExpired().catch(onError) }, intervalMs)
    this.cleanupTimer.unref()
  }

  stopCleanup (): void {
    clearInterval(this.cleanupTimer)
  }
}
