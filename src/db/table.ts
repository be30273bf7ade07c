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

/** A merge patch of one row (a member null: NULL), when its version is one `versions` names. */
export interface RowUpdate { id: bigint, patch: Record<string, unknown>, versions: Precondition }

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

// p.versions: the versions a conditional write accepts, comma-separated, or NULL for any.
const MATCHES_VERSIONS = "(p.versions IS NULL OR t.xmin::text = ANY(string_to_array(p.versions, ',')))"

const versionList = (versions: Precondition): string | null => versions === undefined ? null : versions.join(',')

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
  private readonly updateMany: string
  private readonly deleteMany: string

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
    // p: one row per update or delete; a member's column is set only where its set_ flag says so.
    const flags = this.columns.map((column, i) =>
      `$${2 * i + 3}::boolean[], $${2 * i + 4}::${columnTypes[column] ?? 'text'}[]`).join(', ')
    const names = this.columns.map(column => `set_${column}, new_${column}`).join(', ')
    const sets = this.columns.map(column =>
      `${column} = CASE WHEN p.set_${column} THEN p.new_${column} ELSE t.${column} END`)
    this.updateMany = `UPDATE ${name} AS t SET ${sets.join(', ')}
      FROM unnest($1::bigint[], $2::text[], ${flags}) AS p(id, versions, ${names})
      WHERE t.id = p.id AND ${MATCHES_VERSIONS}
      RETURNING t.xmin::text AS version, t.id, ${this.columns.map(column => `t.${column}`).join(', ')}`
    this.deleteMany = `DELETE FROM ${name} AS t USING unnest($1::bigint[], $2::text[]) AS p(id, versions)
      WHERE t.id = p.id AND ${MATCHES_VERSIONS} RETURNING t.id`
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
   * Sets each update's members (null: NULL) when its row's version is one its `versions` names, all in one
   * statement: two updates that name the same version cannot both succeed. One update per row: a statement
   * would apply only one of two. An update with no member is a read.
   */
  async updateBatch (updates: ReadonlyArray<RowUpdate>): Promise<Array<Versioned<T> | Refusal>> {
    const values: unknown[][] = [
      updates.map(update => update.id.toString()),
      updates.map(update => versionList(update.versions))
    ]
    for (const column of this.columns) {
      values.push(updates.map(update => column in update.patch))
      values.push(updates.map(update => update.patch[column] ?? null))
    }
    const { rows } = await this.db.query(this.updateMany, values)
    const written = new Map(rows.map(row => [String(row.id), versioned<T>(row)]))
    const refused = updates.filter(update => !written.has(update.id.toString())).map(update => update.id)
    const refusals = await this.refusals(refused)
    return updates.map(update => written.get(update.id.toString()) ?? refusals.get(update.id) ?? 'missing')
  }

  /** Deletes each row when its version is one its `versions` names, all in one statement. */
  async deleteBatch (deletes: ReadonlyArray<{ id: bigint, versions: Precondition }>):
  Promise<Array<'deleted' | Refusal>> {
    const { rows } = await this.db.query<{ id: bigint }>(this.deleteMany,
      [deletes.map(d => d.id.toString()), deletes.map(d => versionList(d.versions))])
    const deleted = new Set(rows.map(row => row.id))
    const refusals = await this.refusals(deletes.filter(d => !deleted.has(d.id)).map(d => d.id))
    return deletes.map(d => deleted.has(d.id) ? 'deleted' : refusals.get(d.id) ?? 'missing')
  }

  /** A write that found no row to change: its row is missing, or has another version. */
  private async refusals (ids: readonly bigint[]): Promise<Map<bigint, Refusal>> {
    if (ids.length === 0) return new Map()
    const { rows } = await this.db.query<{ id: bigint }>(`SELECT id FROM ${this.name} WHERE id = ANY($1::bigint[])`,
      [ids.map(String)])
    const present = new Set(rows.map(row => row.id))
    return new Map(ids.map(id => [id, present.has(id) ? 'mismatch' : 'missing']))
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
    return `table ${this.name} lacks its change-notification triggers: run SELECT announce_changes('${this.name}') ` +
      'in a new migration (one already applied is not run again; docs/architecture.md)'
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
