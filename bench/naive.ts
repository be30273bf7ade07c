/*
 * The naive implementation: what a competent developer writes in an hour with
 * Fastify and pg. Same routes, same TypeBox schemas, the same Ajv options and
 * int8-as-BigInt rule as the service (so the responses are byte-comparable),
 * but one pool query per request, no cache, no batching, a plain string
 * compare for the bearer key, and Fastify's default logging at LOG_LEVEL.
 * Run by bench/run.ts as `node --import tsx bench/naive.ts` on its own empty
 * database. It creates the table of the service's first migration itself, and
 * only that: no trigger or index the service may add for its own speed.
 */
import { Type } from 'typebox'
import Fastify from 'fastify'
import pg from 'pg'
import { CategorySchema, NewCategorySchema, type NewCategory } from '../src/categories/schemas.js'
import { ref } from '../src/http/schemas.js'

const CategoryListSchema = Type.Array(ref(CategorySchema))

const INT8_OID = 20
pg.types.setTypeParser(INT8_OID, BigInt)

const env = process.env
const keys = new Set((env.API_KEYS ?? '').split(',').filter(k => k !== '').map(k => `Bearer ${k}`))
const pool = new pg.Pool({ connectionString: env.DATABASE_URL, max: Number(env.DB_POOL_MAX ?? 10) })

const app = Fastify({
  logger: { level: env.LOG_LEVEL ?? 'info' },
  ajv: { customOptions: { coerceTypes: false, removeAdditional: false, useDefaults: false, formats: { int64: true } } }
})
app.addSchema(NewCategorySchema)
app.addSchema(CategorySchema)

app.addHook('onRequest', async (request, reply) => {
  if (!keys.has(request.headers.authorization ?? '')) {
    const body = { code: 'UNAUTHORIZED', message: 'missing or invalid API key', status: 401 }
    return await reply.code(401).header('www-authenticate', 'Bearer realm="petstore"').send(body)
  }
})

interface Row { id: bigint, name: string, description: string | null }
const toCategory = ({ id, name, description }: Row): Record<string, unknown> =>
  description === null ? { id, name } : { id, name, description }

app.get('/v1/categories', { schema: { response: { 200: CategoryListSchema } } }, async (_request, reply) => {
  const { rows } = await pool.query<Row>('SELECT id, name, description FROM categories ORDER BY id')
  reply.header('cache-control', 'no-cache')
  return rows.map(toCategory)
})

const INSERT = 'INSERT INTO categories (name, description) VALUES ($1, $2) RETURNING id, name, description'
const createSchema = { body: ref(NewCategorySchema), response: { 201: ref(CategorySchema) } }
app.post('/v1/categories', { schema: createSchema }, async (request, reply) => {
  const body = request.body as NewCategory
  const { rows } = await pool.query<Row>(INSERT, [body.name, body.description ?? null])
  const category = toCategory(rows[0] as Row)
  return await reply.code(201).header('location', `/v1/categories/${String(category.id)}`).send(category)
})

await pool.query(`CREATE TABLE IF NOT EXISTS categories (
  id          bigserial PRIMARY KEY,
  name        text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 255),
  description text CHECK (char_length(description) <= 2000)
)`)

app.addHook('onClose', async () => { await pool.end() })
process.once('SIGTERM', () => { app.close().then(() => process.exit(0), () => process.exit(1)) })

await app.listen({ port: Number(env.PORT ?? 3000), host: env.HOST ?? '127.0.0.1' })
