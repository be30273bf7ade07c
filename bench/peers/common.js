// What every peer shares: the key, the table (the service's first migration) and the row shape on the wire.
export const env = process.env
export const expectedAuthorization = new Set((env.API_KEYS ?? '').split(',').filter(k => k !== '').map(k => `Bearer ${k}`))
export const port = Number(env.PORT ?? 3000)
export const host = env.HOST ?? '127.0.0.1'
export const poolMax = Number(env.DB_POOL_MAX ?? 10)
export const unauthorized = { code: 'UNAUTHORIZED', message: 'missing or invalid API key', status: 401 }
export const invalid = { code: 'VALIDATION_FAILED', message: 'name must be a string of 1 to 255 characters, description at most 2000', status: 400 }

export const CREATE_TABLE = `CREATE TABLE IF NOT EXISTS categories (
  id          bigserial PRIMARY KEY,
  name        text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 255),
  description text CHECK (char_length(description) <= 2000)
)`

/** int8 arrives as a string from both postgres.js and Bun.SQL; the API sends a JSON integer and omits a null description. */
export function toCategory (row) {
  return row.description === null ? { id: Number(row.id), name: row.name } : { id: Number(row.id), name: row.name, description: row.description }
}

/** The hand-written check the Express and Hono versions do (Elysia validates with its own schema). */
export function isNewCategory (body) {
  return body !== null && typeof body === 'object' && typeof body.name === 'string' && body.name.length >= 1 && body.name.length <= 255 &&
    (body.description === undefined || (typeof body.description === 'string' && body.description.length <= 2000))
}
