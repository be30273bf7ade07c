import type pg from 'pg'
import { withDatabase } from '../db/errors.js'
import type { Category, NewCategory } from './schemas.js'

interface CategoryRow { id: bigint, name: string, description: string | null }

/** A row as the API shows it: `description` only when it was given. */
function toCategory (row: CategoryRow): Category {
  return row.description === null
    ? { id: row.id, name: row.name }
    : { id: row.id, name: row.name, description: row.description }
}

/** Categories in PostgreSQL. Named statements are prepared once per connection. */
export class CategoryRepository {
  constructor (private readonly pool: pg.Pool) {}

  async list (): Promise<Category[]> {
    const { rows } = await withDatabase(async () => await this.pool.query<CategoryRow>({
      name: 'categories-list',
      text: 'SELECT id, name, description FROM categories ORDER BY id'
    }))
    return rows.map(toCategory)
  }

  async get (id: bigint): Promise<Category | undefined> {
    const { rows } = await withDatabase(async () => await this.pool.query<CategoryRow>({
      name: 'categories-get',
      text: 'SELECT id, name, description FROM categories WHERE id = $1',
      values: [id.toString()]
    }))
    return rows[0] === undefined ? undefined : toCategory(rows[0])
  }

  async create (category: NewCategory): Promise<Category> {
    const { rows } = await withDatabase(async () => await this.pool.query<CategoryRow>({
      name: 'categories-create',
      text: 'INSERT INTO categories (name, description) VALUES ($1, $2) RETURNING id, name, description',
      values: [category.name, category.description ?? null]
    }))
    return toCategory(rows[0] as CategoryRow)
  }
}
