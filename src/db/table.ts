import type pg from 'pg'
import type { Database } from './database.js'

/** A row of a resource's table: a bigserial id and its columns (a NULL column is left out: the API shows only what was given). */
export type Row = { id: bigint } & Record<string, unknown>

/** Rows per chunk of a list read: a short list is one statement, a long one never exists as objects all at once. */
export const LIST_CHUNK_ROWS = 1000

const IDENTIFIER = /^[a-z_][a-z0-9_]*$/

function toRow<T extends Row> (record: Record<string, unknown>): T {
  // undefined, not delete: the serializer skips it alike, and every row keeps one shape (a delete costs V8 its fast path).
  for (const key of Object.keys(record)) if (record[key] === null) record[key] = undefined
  return record as T
}

/**
 * A resource's table: `id bigserial PRIMARY KEY` and the given columns (name: SQL type), read and written
 * through the one Database. The SQL every resource needs (a batch insert that pairs each input with its id,
 * the list in chunks from one snapshot, reads by id) is written once, here.
 */
export class Table<New extends object, T extends Row> {
  private readonly columns: string[]
  private readonly select: string
  private readonly insertOne: string
  private readonly insertMany: string

  constructor (private readonly db: Database, readonly name: string, columnTypes: Record<string, string>) {
    this.columns = Object.keys(columnTypes)
    for (const identifier of [name, ...this.columns]) if (!IDENTIFIER.test(identifier)) throw new Error(`not a plain SQL identifier: ${identifier}`)
    const list = this.columns.join(', ')
    this.select = `SELECT id, ${list} FROM ${name}`
    this.insertOne = `INSERT INTO ${name} (${list}) VALUES (${this.columns.map((_, i) => `$${i + 1}`).join(', ')}) RETURNING id, ${list}`
    // Each input takes its id from the column's own sequence in the CTE, paired with its ordinal, instead of trusting RETURNING's order.
    const arrays = this.columns.map((column, i) => `$${i + 1}::${columnTypes[column] ?? 'text'}[]`).join(', ')
    this.insertMany = `WITH input AS MATERIALIZED (
      SELECT nextval('${name}_id_seq'::regclass) AS id, ${list}, ord
      FROM unnest(${arrays}) WITH ORDINALITY AS t(${list}, ord) ORDER BY ord
    ), inserted AS (INSERT INTO ${name} (id, ${list}) SELECT id, ${list} FROM input)
    SELECT id FROM input ORDER BY ord`
  }

  private values (input: New): unknown[] {
    return this.columns.map(column => (input as Record<string, unknown>)[column] ?? null)
  }

  /** Every input in one statement, committed together; row i belongs to input i. */
  async insertBatch (inputs: New[]): Promise<T[]> {
    const arrays = this.columns.map(column => inputs.map(input => (input as Record<string, unknown>)[column] ?? null))
    const { rows } = await this.db.query<{ id: bigint }>(this.insertMany, arrays)
    if (rows.length !== inputs.length) throw new Error(`batch insert returned ${rows.length} ids for ${inputs.length} rows`)
    return inputs.map((input, i) => toRow<T>({ id: (rows[i] as { id: bigint }).id, ...Object.fromEntries(this.columns.map(c => [c, (input as Record<string, unknown>)[c] ?? null])) }))
  }

  /** One row with the caller's client, inside the caller's transaction (e.g. with its idempotency record). */
  async insertWith (client: pg.ClientBase, input: New): Promise<T> {
    const { rows } = await client.query({ text: this.insertOne, values: this.values(input) })
    return toRow<T>(rows[0] as Record<string, unknown>)
  }

  async get (id: bigint): Promise<T | undefined> {
    const { rows } = await this.db.query(`${this.select} WHERE id = $1`, [id.toString()])
    return rows[0] === undefined ? undefined : toRow<T>(rows[0])
  }

  /** The rows with these ids that exist, in id order. */
  async getMany (ids: readonly bigint[]): Promise<T[]> {
    const { rows } = await this.db.query(`${this.select} WHERE id = ANY($1::bigint[]) ORDER BY id`, [ids.map(String)])
    return rows.map(row => toRow<T>(row))
  }

  /** The rows with ids in [from, to), in id order. */
  async getRange (from: bigint, to: bigint): Promise<T[]> {
    const { rows } = await this.db.query(`${this.select} WHERE id >= $1 AND id < $2 ORDER BY id`, [from.toString(), to.toString()])
    return rows.map(row => toRow<T>(row))
  }

  /**
   * Every row in id order, handed to `onChunk` in chunks of at most `chunkRows`, all from one snapshot. A
   * list that fits in one chunk costs one statement; a longer one is read again through a cursor in a
   * read-only transaction.
   */
  async listInChunks (onChunk: (rows: T[]) => void, chunkRows = LIST_CHUNK_ROWS): Promise<void> {
    const ordered = `${this.select} ORDER BY id`
    const { rows } = await this.db.query(`${ordered} LIMIT $1`, [chunkRows + 1])
    if (rows.length <= chunkRows) {
      if (rows.length > 0) onChunk(rows.map(row => toRow<T>(row)))
      return
    }
    await this.db.withClient(async client => {
      await client.query('BEGIN READ ONLY')
      await client.query(`DECLARE ${this.name}_list NO SCROLL CURSOR FOR ${ordered}`)
      const fetch = `FETCH FORWARD ${chunkRows} FROM ${this.name}_list`
      for (let chunk = await client.query(fetch); chunk.rows.length > 0; chunk = await client.query(fetch)) {
        onChunk(chunk.rows.map(row => toRow<T>(row)))
        if (chunk.rows.length < chunkRows) break
      }
      await client.query('COMMIT')
    })
  }
}
