/*
 * The framework's ceiling: Fastify serving a precomputed array through the
 * same response schema (so fast-json-stringify does the same work as in the
 * service), no database, no auth, no logging. POST parses, validates and
 * serializes with the same schemas, with an in-memory counter for the id.
 * CEILING_DATA names a JSON file of the rows to serve (written by run.ts,
 * the same rows it seeds into the other servers).
 *
 * With CEILING_BODY=buffer it is the Fastify floor instead: a plain Fastify app
 * that checks the same bearer key with @fastify/bearer-auth, as its README
 * shows, and answers GET with the list as one Buffer serialized once, with its
 * ETag (and 304 on If-None-Match): the framework's own limit for the
 * service's cached list, with nothing of the service around it.
 */
import bearerAuth from '@fastify/bearer-auth'
import { Type } from 'typebox'
import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'
import Fastify from 'fastify'
import { CategorySchema, NewCategorySchema, type Category, type NewCategory } from '../src/categories/schemas.js'
import { ref } from '../src/http/schemas.js'

const CategoryListSchema = Type.Array(ref(CategorySchema))

const env = process.env
type Row = { id: number, name: string, description?: string }
const rows = JSON.parse(readFileSync(env.CEILING_DATA ?? '', 'utf8')) as Row[]
const list: Category[] = rows.map(row => ({ ...row, id: BigInt(row.id) }))
let nextId = BigInt(list.length + 1)

const app = Fastify({
  logger: false,
  ajv: { customOptions: { coerceTypes: false, removeAdditional: false, useDefaults: false, formats: { int64: true } } }
})
app.addSchema(NewCategorySchema)
app.addSchema(CategorySchema)

if (env.CEILING_BODY === 'buffer') {
  await app.register(bearerAuth, { keys: new Set((env.API_KEYS ?? '').split(',')) })
  const body = Buffer.from(JSON.stringify(rows))
  const etag = `"${createHash('sha1').update(body).digest('base64url')}"`
  app.get('/v1/categories', async (request, reply) => {
    reply.header('cache-control', 'no-cache').header('etag', etag)
    if (request.headers['if-none-match'] === etag) return await reply.code(304).send()
    return await reply.header('content-type', 'application/json; charset=utf-8').send(body)
  })
} else {
  app.get('/v1/categories', { schema: { response: { 200: CategoryListSchema } } }, async (_request, reply) => {
    reply.header('cache-control', 'no-cache')
    return list
  })
}

const createSchema = { body: ref(NewCategorySchema), response: { 201: ref(CategorySchema) } }
app.post('/v1/categories', { schema: createSchema }, async (request, reply) => {
  const body = request.body as NewCategory
  const category: Category = { id: nextId++, ...body }
  return await reply.code(201).header('location', `/v1/categories/${category.id}`).send(category)
})

process.once('SIGTERM', () => { app.close().then(() => process.exit(0), () => process.exit(1)) })

await app.listen({ port: Number(env.PORT ?? 3000), host: env.HOST ?? '127.0.0.1' })
