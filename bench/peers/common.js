// What every peer shares: the key and the row shape on the wire (bench/servers.ts creates their table).
export const env = process.env
const keys = (env.API_KEYS ?? '').split(',').filter(k => k !== '')
export const expectedAuthorization = new Set(keys.map(k => `Bearer ${k}`))
export const port = Number(env.PORT ?? 3000)
export const host = env.HOST ?? '127.0.0.1'
export const unauthorized = { code: 'UNAUTHORIZED', message: 'missing or invalid API key', status: 401 }
export const invalid = {
  code: 'VALIDATION_FAILED',
  message: 'name must be a string of 1 to 255 characters, description at most 2000',
  status: 400
}
export const INSERT = 'INSERT INTO categories (name, description) VALUES ($1, $2) RETURNING id, name, description'

/** int8 arrives as a string from postgres.js and Bun.SQL; the API sends a JSON integer and omits a null description. */
export function toCategory ({ id, name, description }) {
  return description === null ? { id: Number(id), name } : { id: Number(id), name, description }
}

/** The hand-written check the Express and Hono versions do (Elysia validates with its own schema). */
export function isNewCategory (body) {
  if (body === null || typeof body !== 'object') return false
  const nameOk = typeof body.name === 'string' && body.name.length >= 1 && body.name.length <= 255
  const description = body.description
  return nameOk && (description === undefined || (typeof description === 'string' && description.length <= 2000))
}
