import type pg from 'pg'

export interface CategoryRow { id: bigint | string, name: string, description?: string | null }

/** A category as the contract writes it: the int64 id as a bare number, the description only when present. */
export function categoryJson (c: CategoryRow): string {
  const description = c.description === null || c.description === undefined
    ? ''
    : `,"description":${JSON.stringify(c.description)}`
  return `{"id":${c.id},"name":${JSON.stringify(c.name)}${description}}`
}

/** The categories in id order, as the list reads them. */
export async function categoryRows (client: pg.ClientBase | pg.Pool): Promise<Array<CategoryRow & { id: string }>> {
  // The table's id, not the output's: id::text would sort 10 before 9.
  const { rows } = await client.query<CategoryRow & { id: string }>(
    'SELECT id::text, name, description FROM categories ORDER BY categories.id'
  )
  return rows
}

/** The list body, built from the table by the tests' own code, not the service's. */
export async function expectedListBody (client: pg.ClientBase | pg.Pool): Promise<string> {
  return `[${(await categoryRows(client)).map(categoryJson).join(',')}]`
}
