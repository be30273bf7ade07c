import { createHash, randomUUID } from 'node:crypto'
import type pg from 'pg'
import { withDatabase } from '../db/errors.js'
import { ApiError } from '../http/errors.js'
import type { NewCategory } from './schemas.js'

/*
 * Idempotency-Key for createCategory, as the contract says: scoped to the API
 * key, remembered 24 hours in PostgreSQL (so every instance agrees), the same
 * key and body replays the first answer, a different body is 422, a request
 * still running is 409.
 *
 * A request first claims the key (a 'running' record, committed on its own so
 * other instances see it). The category row and the record's completion then
 * commit in one transaction, so a 201 and its replayable answer exist together
 * or not at all. A claim whose holder died (crash between claim and commit)
 * can be taken over by the same body after LOCK_SECONDS; the holder's commit
 * re-checks its claim under a row lock, so two holders can never both insert.
 */

const REMEMBER = '24 hours'
const LOCK_SECONDS = 60
const RETRY_AFTER_SECONDS = 1

export interface StoredResponse { status: number, body: string, location: string | null }

export type Claim =
  | { kind: 'claimed', token: string }
  | { kind: 'replay', response: StoredResponse }

/** The body as the service understood it: the same category sent with other spacing or member order is the same body. */
export function requestHash (category: NewCategory): Buffer {
  return createHash('sha256').update(JSON.stringify([category.name, category.description ?? null])).digest()
}

// Nothing here waits on a row lock: a request that is completing holds its record
// FOR UPDATE until it commits, and a concurrent request must answer 409 at once.
const CLAIM = `
INSERT INTO idempotency_keys (key_owner, idempotency_key, request_hash, state, claim_token, locked_until, expires_at)
VALUES ($1, $2, $3, 'running', $4, now() + make_interval(secs => ${LOCK_SECONDS}), now() + interval '${REMEMBER}')
ON CONFLICT (key_owner, idempotency_key) DO NOTHING
RETURNING claim_token`

/** Takes over an expired record, or a 'running' one with the same body whose holder's lock lapsed. */
const TAKE_OVER = `
UPDATE idempotency_keys
SET request_hash = $3, state = 'running', claim_token = $4,
    locked_until = now() + make_interval(secs => ${LOCK_SECONDS}), expires_at = now() + interval '${REMEMBER}',
    response_status = NULL, response_body = NULL, location = NULL
WHERE ctid = (SELECT ctid FROM idempotency_keys WHERE key_owner = $1 AND idempotency_key = $2 FOR UPDATE SKIP LOCKED)
  AND (expires_at < now() OR (state = 'running' AND locked_until < now() AND request_hash = $3))
RETURNING claim_token`

const EXISTING = `
SELECT request_hash, state, response_status, response_body, location, expires_at < now() AS expired
FROM idempotency_keys WHERE key_owner = $1 AND idempotency_key = $2`

interface ExistingRow { request_hash: Buffer, state: 'running' | 'done', response_status: number | null, response_body: string | null, location: string | null, expired: boolean }

export class IdempotencyStore {
  private cleanupTimer: NodeJS.Timeout | undefined

  constructor (private readonly pool: pg.Pool) {}

  /** Claims the key for this request, or says what to answer instead (replay, 409, 422). */
  async claim (owner: Buffer, key: string, hash: Buffer): Promise<Claim> {
    // Two rounds: the record we conflicted with may expire or be released between the two statements.
    for (let round = 0; round < 2; round++) {
      const token = randomUUID()
      const claimed = await withDatabase(async () => await this.pool.query({ name: 'idempotency-claim', text: CLAIM, values: [owner, key, hash, token] }))
      if (claimed.rowCount === 1) return { kind: 'claimed', token }
      const taken = await withDatabase(async () => await this.pool.query({ name: 'idempotency-take-over', text: TAKE_OVER, values: [owner, key, hash, token] }))
      if (taken.rowCount === 1) return { kind: 'claimed', token }
      const { rows } = await withDatabase(async () => await this.pool.query<ExistingRow>({ name: 'idempotency-existing', text: EXISTING, values: [owner, key] }))
      const existing = rows[0]
      if (existing === undefined) continue
      // Expired but not taken over: another request is taking it over right now.
      if (existing.expired) break
      if (!existing.request_hash.equals(hash)) {
        throw new ApiError(422, 'IDEMPOTENCY_KEY_REUSED', 'this Idempotency-Key was already used with a different request body')
      }
      if (existing.state === 'running') break
      return { kind: 'replay', response: { status: existing.response_status ?? 201, body: existing.response_body ?? '', location: existing.location } }
    }
    throw new ApiError(409, 'IDEMPOTENCY_KEY_IN_USE', 'a request with this Idempotency-Key is still being processed; retry later',
      { 'retry-after': String(RETRY_AFTER_SECONDS) })
  }

  /**
   * Runs `work` in a transaction that also completes the claim: both commit or
   * neither does. If the claim was taken over meanwhile, nothing is written.
   */
  async complete<T> (owner: Buffer, key: string, token: string, work: (client: pg.PoolClient) => Promise<{ result: T, response: StoredResponse }>): Promise<T> {
    return await withDatabase(async () => {
      const client = await this.pool.connect()
      let broken: Error | undefined
      try {
        await client.query('BEGIN')
        const held = await client.query({
          name: 'idempotency-hold',
          text: "SELECT 1 FROM idempotency_keys WHERE key_owner = $1 AND idempotency_key = $2 AND claim_token = $3 AND state = 'running' FOR UPDATE",
          values: [owner, key, token]
        })
        if (held.rowCount !== 1) {
          await client.query('ROLLBACK')
          throw new ApiError(409, 'IDEMPOTENCY_KEY_IN_USE', 'a request with this Idempotency-Key is still being processed; retry later',
            { 'retry-after': String(RETRY_AFTER_SECONDS) })
        }
        const { result, response } = await work(client)
        await client.query({
          name: 'idempotency-done',
          text: "UPDATE idempotency_keys SET state = 'done', response_status = $4, response_body = $5, location = $6 WHERE key_owner = $1 AND idempotency_key = $2 AND claim_token = $3",
          values: [owner, key, token, response.status, response.body, response.location]
        })
        await client.query('COMMIT')
        return result
      } catch (err) {
        if (!(err instanceof ApiError && err.status === 409)) {
          await client.query('ROLLBACK').catch((rollbackError: Error) => { broken = rollbackError })
        }
        throw err
      } finally {
        client.release(broken)
      }
    })
  }

  /** Gives the key back after a failed request, so an immediate retry need not wait for the lock to expire. */
  async release (owner: Buffer, key: string, token: string): Promise<void> {
    await this.pool.query({
      name: 'idempotency-release',
      text: "DELETE FROM idempotency_keys WHERE key_owner = $1 AND idempotency_key = $2 AND claim_token = $3 AND state = 'running'",
      values: [owner, key, token]
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
