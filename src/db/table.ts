import type pg from 'pg'
import type { TObject, TSchema } from 'typebox'
import type { Database } from './database.js'
import { JsonCopyWriter, type JsonSegment } from './json-copy.js'

/** A row of a resource's table; a NULL column is undefined (the API shows only what was given). */
export interface Row { id: bigint }

/** A row and its version: the xmin of its tuple, new with every committed update of it. */
export interface Versioned<T> { row: T, version: string }

/** The versions a conditional write accepts (If-Match); undefined: any. */
export type Precondition = readonly string[] | undefined

/** Why a conditional write wrote nothing. */
export type Refusal = 'missing' | 'mismatch'

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

// $2: the versions a conditional write accepts, or NULL for any.
const MATCHES_VERSION = '($2::xid[] IS NULL OR xmin = ANY($2::xid[]))'

function versioned<T extends Row> ({ version, ...record }: Record<string, unknown>): Versioned<T> {
  return { row: toRow<T>(record), version: String(version) }
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
  private readonly selectVersioned: string
  private readonly insertOne: string
  private readonly insertMany: string

  constructor (private readonly db: Database, readonly name: string,
    private readonly columnTypes: Record<string, string>) {
    this.columns = Object.keys(columnTypes)
    if (!IDENTIFIER.test(name)) throw new Error(`not a plain SQL identifier: ${name}`)
    const list = this.columns.join(', ')
    this.select = `SELECT id, ${list} FROM ${name}`
    this.selectVersioned = `SELECT xmin::text AS version, id, ${list} FROM ${name}`
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

  async get (id: bigint): Promise<Versioned<T> | undefined> {
    const { rows } = await this.db.query(`${this.selectVersioned} WHERE id = $1`, [id.toString()])
    return rows[0] === undefined ? undefined : versioned<T>(rows[0])
  }

  /** The rows with these ids that exist, in id order. */
  async getMany (ids: readonly bigint[]): Promise<T[]> {
    return await this.rows('id = ANY($1::bigint[]) ORDER BY id', [ids.map(String)])
  }

  /** Up to `limit` rows with ids above `after`, in id order. */
  async page (after: bigint, limit: number): Promise<T[]> {
    return await this.rows('id > $1 ORDER BY id LIMIT $2', [after.toString(), limit])
  }

  /**
   * Sets the members of `patch` (null: NULL) when the row's version is one `versions` names, in one statement:
   * two updates that name the same version cannot both succeed.
   */
  async update (id: bigint, patch: Record<string, unknown>, versions: Precondition):
  Promise<Versioned<T> | Refusal> {
    const members = this.columns.filter(column => column in patch)
    if (members.length === 0) return await this.unchanged(id, versions)
    const set = members.map((column, i) => `${column} = $${i + 3}`).join(', ')
    const { rows } = await this.db.query(`UPDATE ${this.name} SET ${set} WHERE id = $1 AND ${MATCHES_VERSION} ` +
      `RETURNING xmin::text AS version, id, ${this.columns.join(', ')}`,
    [id.toString(), versions, ...members.map(column => patch[column])])
    return rows[0] === undefined ? await this.refusal(id) : versioned<T>(rows[0])
  }

  /** Deletes the row when its version is one `versions` names, in one statement. */
  async delete (id: bigint, versions: Precondition): Promise<'deleted' | Refusal> {
    const { rowCount } = await this.db.query(`DELETE FROM ${this.name} WHERE id = $1 AND ${MATCHES_VERSION}`,
      [id.toString(), versions])
    return rowCount === 1 ? 'deleted' : await this.refusal(id)
  }

  private async unchanged (id: bigint, versions: Precondition): Promise<Versioned<T> | Refusal> {
    const found = await this.get(id)
    if (found === undefined) return 'missing'
    return versions === undefined || versions.includes(found.version) ? found : 'mismatch'
  }

  /** Why a conditional write of `id` touched no row. */
  private async refusal (id: bigint): Promise<Refusal> {
    const { rowCount } = await this.db.query(`SELECT 1 FROM ${this.name} WHERE id = $1`, [id.toString()])
    return rowCount === 0 ? 'missing' : 'mismatch'
  }

  private async rows (where: string, values: unknown[]): Promise<T[]> {
    return (await this.db.query(`${this.select} WHERE ${where}`, values)).rows.map(row => toRow<T>(row))
  }

  /** Every row in id order as JSON (json-copy.ts), segment by segment, from one snapshot. */
  async listJson (segmentIds: number, onSegment: (segment: JsonSegment) => void, copyRows = COPY_ROWS):
  Promise<void> {
    const writer = new JsonCopyWriter(this.columnTypes, segmentIds, onSegment)
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

  /** Why this table cannot serve (missing, a member without its column, no change triggers), or undefined. */
  async problem (): Promise<string | undefined> {
    const { rows } = await this.db.query<TableState>(TABLE_STATE, [this.name])
    const found = rows[0]
    if (found?.exists !== true) return `table ${this.name} does not exist: apply its migration`
    const missing = ['id', ...this.columns].find(column => !found.columns.includes(column))
    if (missing !== undefined) {
      return `table ${this.name} has no column ${missing}, which its schema's member needs: add it in a new migration`
    }
    if (found.announces) return undefined
    return `table ${this.name} lacks its change-notification triggers: its migration must run ` +
      `SELECT announce_changes('${this.name}') (docs/architecture.md)`
  }
}

interface TableState { exists: boolean, columns: string[], announces: boolean }

// pg_trigger.tgtype bits: 1 row-level, 2 before, 4 insert, 8 delete, 16 update, 32 truncate, 64 instead; a statement
// trigger AFTER the event has none of 1, 2 and 64 (67). Each event needs its function (migrations' announce_changes).
const TABLE_STATE = `
SELECT to_regclass($1) IS NOT NULL AS exists,
  array(SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped)
    AS columns,
  count(DISTINCT p.proname) FILTER (WHERE t.tgtype & 67 = 0 AND (
    (p.proname = 'notify_table_insert' AND t.tgtype & 4 <> 0) OR
    (p.proname = 'notify_table_update' AND t.tgtype & 16 <> 0) OR
    (p.proname = 'notify_table_delete' AND t.tgtype & 8 <> 0) OR
    (p.proname = 'notify_table_change' AND t.tgtype & 32 <> 0)
  )) = 4 AS announces
FROM (SELECT 1) AS one
LEFT JOIN pg_trigger t ON t.tgrelid = to_regclass($1) AND t.tgenabled <> 'D'
LEFT JOIN pg_proc p ON p.oid = t.tgfoid`
