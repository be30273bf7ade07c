// Elysia on Bun with Bun's own SQL client, as their documentation writes it: one query a request, no cache.
import { sql } from 'bun'
import { Elysia, t } from 'elysia'
import { expectedAuthorization, host, invalid, port, toCategory, unauthorized } from './common.js'

new Elysia()
  .onBeforeHandle(({ headers, set }) => {
    if (!expectedAuthorization.has(headers.authorization ?? '')) {
      set.status = 401
      set.headers['www-authenticate'] = 'Bearer realm="petstore"'
      return unauthorized
    }
  })
  .onError(({ code, set }) => {
    if (code === 'VALIDATION') {
      set.status = 400
      return invalid
    }
  })
  .get('/v1/categories', async ({ set }) => {
    const rows = await sql`SELECT id, name, description FROM categories ORDER BY id`
    set.headers['cache-control'] = 'no-cache'
    return rows.map(toCategory)
  })
  .post('/v1/categories', async ({ body, set }) => {
    const [row] = await sql`INSERT INTO categories (name, description)
      VALUES (${body.name}, ${body.description ?? null}) RETURNING id, name, description`
    const category = toCategory(row)
    set.status = 201
    set.headers.location = `/v1/categories/${category.id}`
    return category
  }, {
    body: t.Object({
      name: t.String({ minLength: 1, maxLength: 255 }),
      description: t.Optional(t.String({ maxLength: 2000 }))
    }, { additionalProperties: false })
  })
  .listen({ port, hostname: host })
