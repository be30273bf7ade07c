import type pg from 'pg'
import { withDatabase } from '../db/errors.js'
import { confirmReplicated } from '../db/servers.js'
import type { Category, NewCategory } from './schemas.js'

interface CategoryRow { id: bigint, name: string, description: string | null }

/** A row as the API shows it: `description` only when it was given. */
function toCategory (row: CategoryRow): Category {
  return row.description === null
    ? { id: row.id, name: row.name }
    : { id: row.id, name: row.name, description: row.description }
}

function withId (id: bigint, category: NewCategory): Category {
  return category.description === undefined
    ? { id, name: category.name }
    : { id, name: category.name, description: category.description }
}

/*
 * Many rows in one statement (one round trip, one commit). Each input row takes
 * its id from the column's own sequence in the CTE, so the id is paired with its
 * ordinal explicitly instead of relying on the order of RETURNING.
 */
const INSERT_BATCH = `
WITH input AS MATERIALIZED (
  SELECT nextval('categories_id_seq'::regclass) AS id, t.name, t.description, t.ord
  FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(name, description, ord)
  ORDER BY t.ord
), inserted AS (
  INSERT INTO categories (id, name, description) SELECT id, name, description FROM input
)
SELECT id FROM input ORDER BY ord`

const LIST = 'SELECT id, name, description FROM categories ORDER BY id'

/** Rows per chunk of a list read: a short list is one round trip, a long one never exists as objects all at once. */
export const LIST_CHUNK_ROWS = 1000

/** Categories in PostgreSQL. */
export class CategoryRepository {
  constructor (private readonly pool: pg.Pool) {}

  /**
   * Every category in id order, handed to `onChunk` in chunks of at most
   * `chunkRows`, all from one snapshot: a list of any length never exists as
   * objects all at once (the caller serializes each chunk and drops it). A
   * list that fits in one chunk, the usual case, costs one statement; a longer
   * one is read again through a cursor in a read-only transaction.
   */
  async listInChunks (onChunk: (categories: Category[]) => void, chunkRows = LIST_CHUNK_ROWS): Promise<void> {
    await withDatabase(async () => {
      const { rows } = await this.pool.query<CategoryRow>({ text: `${LIST} LIMIT $1`, values: [chunkRows + 1] })
      if (rows.length <= chunkRows) {
        if (rows.length > 0) onChunk(rows.map(toCategory))
        return
      }
      const client = await this.pool.connect()
      try {
        await client.query('BEGIN READ ONLY')
        await client.query(`DECLARE categories_list NO SCROLL CURSOR FOR ${LIST}`)
        const fetch = `FETCH FORWARD ${chunkRows} FROM categories_list`
        for (let chunk = await client.query<CategoryRow>(fetch); chunk.rows.length > 0; chunk = await client.query<CategoryRow>(fetch)) {
          onChunk(chunk.rows.map(toCategory))
          if (chunk.rows.length < chunkRows) break
        }
        await client.query('COMMIT')
      } catch (err) {
        // The connection is in an unknown state (an open transaction, a half-read cursor): it is closed, not reused.
        client.release(err as Error)
        throw err
      }
      client.release()
    })
  }

  async get (id: bigint): Promise<Category | undefined> {
    const { rows } = await withDatabase(async () => await this.pool.query<CategoryRow>({
      text: 'SELECT id, name, description FROM categories WHERE id = $1',
      values: [id.toString()]
    }))
    return rows[0] === undefined ? undefined : toCategory(rows[0])
  }

  /** One category with the caller's client, inside the caller's transaction (e.g. with its idempotency record). */
  async insertWith (client: pg.ClientBase, category: NewCategory): Promise<Category> {
    const { rows } = await withDatabase(async () => await client.query<CategoryRow>({
      text: 'INSERT INTO categories (name, description) VALUES ($1, $2) RETURNING id, name, description',
      values: [category.name, category.description ?? null]
    }))
    return toCategory(rows[0] as CategoryRow)
  }

  /** Inserts every category in one statement, committed together; result i belongs to input i. */
  async insertBatch (categories: NewCategory[]): Promise<Category[]> {
    const rows = await withDatabase(async () => {
      const client = await this.pool.connect()
      try {
        const { rows } = await client.query<{ id: bigint }>({
          text: INSERT_BATCH,
          values: [categories.map(c => c.name), categories.map(c => c.description ?? null)]
        })
        confirmReplicated(client)
        client.release()
        return rows
      } catch (err) {
        client.release(err as Error)
        throw err
      }
    })
    if (rows.length !== categories.length) throw new Error(`batch insert returned ${rows.length} ids for ${categories.length} rows`)
    return categories.map((category, i) => withId((rows[i] as { id: bigint }).id, category))
  }
}
