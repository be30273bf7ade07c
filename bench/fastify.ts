/*
 * The Fastify baselines, with the service's schemas and Ajv options, so that their lists are byte-comparable.
 * BENCH_FASTIFY picks one (bench/README.md, "The servers"):
 * - floor: @fastify/bearer-auth as its README shows, the list as one Buffer made once, with its ETag and 304;
 * - ceiling: no database, no auth, no logging; the list an in-memory array serialized through the response schema;
 * - naive: what a competent developer writes in an hour with pg: one pool query per request, no cache, a plain
 *   string compare for the key, Fastify's logging at LOG_LEVEL (bench/servers.ts creates its table).
 */
import bearerAuth from '@fastify/bearer-auth'
import { Type } from 'typebox'
import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'
import Fastify from 'fastify'
import pg from 'pg'
import { CategorySchema, NewCategorySchema, type NewCategory } from '../src/categories/schemas.js'
import { ref } from '../src/http/schemas.js'

const INT8_OID = 20
const env = process.env
const mode = env.BENCH_FASTIFY
const keys = (env.API_KEYS ?? '').split(',').filter(key => key !== '')
const listSchema = { schema: { response: { 200: Type.Array(ref(CategorySchema)) } } }
const createSchema = { schema: { body: ref(NewCategorySchema), response: { 201: ref(CategorySchema) } } }
type Row = { id: bigint, name: string, description?: string | null }
const toCategory = ({ id, name, description }: Row): Row =>
  description === null ? { id, name } : { id, name, description }

const app = Fastify({
  logger: mode === 'naive' ? { level: env.LOG_LEVEL ?? 'info' } : false,
  ajv: { customOptions: { coerceTypes: false, removeAdditional: false, useDefaults: false, formats: { int64: true } } }
})
app.addSchema(NewCategorySchema)
app.addSchema(CategorySchema)

if (mode === 'naive') {
  pg.types.setTypeParser(INT8_OID, BigInt)
  const bearers = new Set(keys.map(key => `Bearer ${key}`))
  const pool = new pg.Pool({ connectionString: env.DATABASE_URL })
  app.addHook('onRequest', async (request, reply) => {
    if (bearers.has(request.headers.authorization ?? '')) return
    const body = { code: 'UNAUTHORIZED', message: 'missing or invalid API key', status: 401 }
    return await reply.code(401).header('www-authenticate', 'Bearer realm="petstore"').send(body)
  })
  app.get('/v1/categories', listSchema, async (_request, reply) => {
    const { rows } = await pool.query<Row>('SELECT id, name, description FROM categories ORDER BY id')
    reply.header('cache-control', 'no-cache')
    return rows.map(toCategory)
  })
  app.post('/v1/categories', createSchema, async (request, reply) => {
    const { name, description = null } = request.body as NewCategory
    const insert = 'INSERT INTO categories (name, description) VALUES ($1, $2) RETURNING id, name, description'
    const category = toCategory((await pool.query<Row>(insert, [name, description])).rows[0] as Row)
    return await reply.code(201).header('location', `/v1/categories/${category.id}`).send(category)
  })
} else {
  // BENCH_ROWS: a JSON file of the rows the other servers are seeded with.
  const rows = JSON.parse(readFileSync(env.BENCH_ROWS ?? '', 'utf8')) as Array<{ id: number }>
  const list = rows.map(row => ({ ...row, id: BigInt(row.id) }))
  let nextId = BigInt(list.length + 1)
  if (mode === 'floor') {
    await app.register(bearerAuth, { keys: new Set(keys) })
    const body = Buffer.from(JSON.stringify(rows))
    const etag = `"${createHash('sha1').update(body).digest('base64url')}"`
    app.get('/v1/categories', async (request, reply) => {
      reply.header('cache-control', 'no-cache').header('etag', etag)
      if (request.headers['if-none-match'] === etag) return await reply.code(304).send()
      return await reply.header('content-type', 'application/json; charset=utf-8').send(body)
    })
  } else {
    app.get('/v1/categories', listSchema, async (_request, reply) => {
      reply.header('cache-control', 'no-cache')
      return list
    })
  }
  app.post('/v1/categories', createSchema, async (request, reply) => {
    const category = { id: nextId++, ...request.body as NewCategory }
    return await reply.code(201).header('location', `/v1/categories/${category.id}`).send(category)
  })
}

await app.listen({ port: Number(env.PORT ?? 3000), host: env.HOST ?? '127.0.0.1' })
