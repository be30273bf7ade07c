import type pg from 'pg'
import type { TObject, TSchema } from 'typebox'
import type { Database } from './database.js'
import { JsonCopyWriter, type JsonSegment } from './json-copy.js'

/** A row of a resource's table; a NULL column is undefined (the API shows only what was given). */
export interface Row { id: bigint }

/** Rows per COPY of a list written as JSON: each statement stays well within a statement timeout. */
const COPY_ROWS = 100_000

const IDENTIFIER = /^[a-z_][a-z0-9_]*$/
const SQL_TYPES: Record<string, string> = {
  string: 'text', integer: 'bigint', number: 'double precision', boolean: 'boolean'
}

/** Each member of a create body's schema as a column and its SQL type: a member cannot be left out. */
export function columnsOf (schema: TObject): Record<string, string> {
  return Object.fromEntries(Object.entries(schema.properties as Record<string, TSchema & { type?: unknown }>)
    .map(([name, member]) => {
      const type = SQL_TYPES[String(member.type)]
      if (type === undefined || !IDENTIFIER.test(name)) throw new Error(`member ${name}: no column for its schema`)
      return [name, type]
    }))
}

function toRow<T extends Row> (record: Record<string, unknown>): T {
  // undefined, not delete: every row keeps one shape (a delete costs V8 its fast path).
  for (const key of Object.keys(record)) if (record[key] === null) record[key] = undefined
  return record as T
}

/** The SQL every resource needs, written once: batch insert, insert, reads by id and range, the list as JSON. */
export class Table<New extends object, T extends Row> {
  readonly columns: string[]
  private readonly select: string
  private readonly insertOne: string
  private readonly insertMany: string

  constructor (private readonly db: Database, readonly name: string,
    private readonly columnTypes: Record<string, string>) {
    this.columns = Object.keys(columnTypes)
    if (!IDENTIFIER.test(name)) throw new Error(`not a plain SQL identifier: ${name}`)
    const list = this.columns.join(', ')
    this.select = `SELECT id, ${list} FROM ${name}`
    const params = this.columns.map((_, i) => `$${i + 1}`).join(', ')
    this.insertOne = `INSERT INTO ${name} (${list}) VALUES (${params}) RETURNING id, ${list}`
    // Ids come from the sequence in input order, paired by ordinal: RETURNING's order is not promised.
    const arrays = this.columns.map((column, i) => `$${i + 1}::${columnTypes[column] ?? 'text'}[]`).join(', ')
    this.insertMany = `WITH input AS MATERIALIZED (
      SELECT nextval('${name}_id_seq'::regclass) AS id, ${list}, ord
      FROM unnest(${arrays}) WITH ORDINALITY AS t(${list}, ord) ORDER BY ord
    ), inserted AS (INSERT INTO ${name} (id, ${list}) SELECT id, ${list} FROM input)
    SELECT id FROM input ORDER BY ord`
  }

  /** The input's values in column order (absent: null). */
  values (input: New): unknown[] {
    return this.columns.map(column => (input as Record<string, unknown>)[column] ?? null)
  }

  /** Every input in one statement, committed together; row i belongs to input i. */
  async insertBatch (inputs: New[]): Promise<T[]> {
    const values = inputs.map(input => this.values(input))
    const arrays = this.columns.map((_, c) => values.map(v => v[c]))
    const { rows } = await this.db.query<{ id: bigint }>(this.insertMany, arrays)
    if (rows.length !== inputs.length) throw new Error(`batch insert: ${rows.length} ids for ${inputs.length} rows`)
    return values.map((row, i) =>
      toRow<T>({ id: rows[i]?.id, ...Object.fromEntries(this.columns.map((c, j) => [c, row[j]])) }))
  }

  /** One row inside the caller's transaction (e.g. with its idempotency record). */
  async insertWith (client: pg.ClientBase, input: New): Promise<T> {
    const { rows } = await client.query({ text: this.insertOne, values: this.values(input) })
    return toRow<T>(rows[0] as Record<string, unknown>)
  }

  async get (id: bigint): Promise<T | undefined> { return (await this.rows('id = $1', [id.toString()]))[0] }

  /** The rows with these ids that exist, in id order. */
  async getMany (ids: readonly bigint[]): Promise<T[]> {
    return await this.rows('id = ANY($1::bigint[])', [ids.map(String)])
  }

  /** The rows with ids in [from, to), in id order. */
  async getRange (from: bigint, to: bigint): Promise<T[]> {
    return await this.rows('id >= $1 AND id < $2', [from.toString(), to.toString()])
  }

  private async rows (where: string, values: unknown[]): Promise<T[]> {
    return (await this.db.query(`${this.select} WHERE ${where} ORDER BY id`, values)).rows.map(row => toRow<T>(row))
  }

  /** Every row in id order as JSON (json-copy.ts), segment by segment, from one snapshot. */
  async listJson (segmentIds: bigint, onSegment: (segment: JsonSegment) => void, copyRows = COPY_ROWS):
  Promise<void> {
    const writer = new JsonCopyWriter(this.columnTypes, Number(segmentIds), onSegment)
    const casts = Object.entries(this.columnTypes).map(([column, type]) => `${column}::${type}`).join(', ')
    await this.db.transaction(async client => {
      let where = ''
      do {
        await writer.copy(client, `COPY (SELECT id::bigint, ${casts} FROM ${this.name} ${where} ORDER BY id ` +
          `LIMIT ${copyRows}) TO STDOUT (FORMAT binary)`)
        where = `WHERE id > ${writer.lastId}`
      } while (writer.copied === copyRows)
    }, 'BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY')
    writer.finish()
  }

  /** Why this table cannot serve (missing, or its change-notification triggers are), or undefined. */
  async problem (): Promise<string | undefined> {
    const { rows } = await this.db.query<{ exists: boolean, inserts: boolean, changes: boolean }>(TRIGGERS, [this.name])
    const found = rows[0]
    if (found?.exists !== true) return `table ${this.name} does not exist: apply its migration`
    if (found.inserts && found.changes) return undefined
    return `table ${this.name} lacks its change-notification triggers; its migration must add both ` +
      '(notify_table_insert AFTER INSERT, notify_table_change AFTER UPDATE OR DELETE OR TRUNCATE; docs/architecture.md)'
  }
}

// pg_trigger.tgtype bits: 1 row-level, 2 before, 4 insert, 8 delete, 16 update, 32 truncate, 64 instead.
const TRIGGERS = `
SELECT to_regclass($1) IS NOT NULL AS exists,
  coalesce(bool_or(p.proname = 'notify_table_insert' AND t.tgtype & 71 = 4), false) AS inserts,
  coalesce(bool_or(p.proname = 'notify_table_change' AND t.tgtype & 67 = 0 AND t.tgtype & 56 = 56), false) AS changes
FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
WHERE t.tgrelid = to_regclass($1) AND t.tgenabled <> 'D'`
