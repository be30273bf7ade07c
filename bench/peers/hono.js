// Hono on Node (@hono/node-server) with postgres.js, as their documentation writes it: one query a request.
import { serve } from '@hono/node-server'
import { Hono } from 'hono'
import postgres from 'postgres'
import { env, expectedAuthorization, host, invalid, isNewCategory, port, toCategory, unauthorized } from './common.js'

const sql = postgres(env.DATABASE_URL)

const app = new Hono()

app.use('/v1/*', async (c, next) => {
  if (!expectedAuthorization.has(c.req.header('authorization') ?? '')) {
    c.header('www-authenticate', 'Bearer realm="petstore"')
    return c.json(unauthorized, 401)
  }
  await next()
})

app.get('/v1/categories', async (c) => {
  const rows = await sql`SELECT id, name, description FROM categories ORDER BY id`
  c.header('cache-control', 'no-cache')
  return c.json(rows.map(toCategory))
})

app.post('/v1/categories', async (c) => {
  const body = await c.req.json().catch(() => null)
  if (!isNewCategory(body)) return c.json(invalid, 400)
  const [row] = await sql`INSERT INTO categories (name, description)
    VALUES (${body.name}, ${body.description ?? null}) RETURNING id, name, description`
  const category = toCategory(row)
  c.header('location', `/v1/categories/${category.id}`)
  return c.json(category, 201)
})

serve({ fetch: app.fetch, port, hostname: host })
