import type { FastifyInstance } from 'fastify'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import fp from 'fastify-plugin'
import { MALFORMED_JSON, errorResponses, notFound } from '../http/errors.js'
import { Int64IdParams, int64IdValidatorCompiler } from '../http/int64-id.js'
import { createHandler, listHandler } from '../http/replies.js'
import { IdempotencyKeyHeaders, NotModified, ref } from '../http/schemas.js'
import { CategorySchema, NewCategorySchema, type Category, type NewCategory } from './schemas.js'

const tags = ['categories']

/** Categories: a table of their own, their cached list and one write path (app.collection), and three operations. */
async function categories (app: FastifyInstance): Promise<void> {
  app.addSchema(NewCategorySchema)
  app.addSchema(CategorySchema)
  app.describeTag('categories', 'Categories of pets')
  const categories = app.collection<NewCategory, Category>({ name: 'categories', columns: { name: 'text', description: 'text' }, createOperation: 'createCategory' })
  const api = app.withTypeProvider<TypeBoxTypeProvider>()

  api.get('/v1/categories', {
    schema: {
      operationId: 'listCategories',
      summary: 'List every category',
      description: 'All categories, ordered by id ascending; no paging. The 200 carries a strong ETag; send it back in If-None-Match to get a 304 while the list is unchanged.',
      tags,
      response: {
        200: Type.Array(ref(CategorySchema), { description: 'Every category, ordered by id ascending' }),
        304: NotModified,
        ...errorResponses([401, 429, 500, 503])
      }
    }
  }, listHandler(categories))

  api.post('/v1/categories', {
    schema: {
      operationId: 'createCategory',
      summary: 'Create a category',
      description: 'Stores the category exactly as sent. A 201 means the row is committed. Send an Idempotency-Key to make retries safe.',
      tags,
      headers: IdempotencyKeyHeaders,
      body: ref(NewCategorySchema),
      response: {
        201: ref(CategorySchema, { description: 'Created and committed: the stored category; Location is its URL' }),
        ...errorResponses([400, 401, 409, 413, 415, 422, 429, 500, 503], {
          400: [
            { summary: 'A rule of NewCategory is broken', body: { code: 'VALIDATION_FAILED', message: "request body is missing the required member 'name'", status: 400 } },
            { summary: 'The body is not JSON', body: { code: MALFORMED_JSON, message: 'request body is not valid JSON', status: 400 } }
          ]
        })
      }
    }
  }, createHandler(categories, category => `/v1/categories/${category.id}`))

  api.get('/v1/categories/:id', {
    schema: {
      operationId: 'getCategory',
      summary: 'Get one category',
      description: 'Experimental extension of the interface.',
      'x-stability': 'experimental',
      tags,
      params: Int64IdParams,
      response: {
        200: ref(CategorySchema, { description: 'The category with this id' }),
        ...errorResponses([400, 401, 404, 429, 500, 503], { 400: "'id' must be a decimal integer from 1 to 9223372036854775807", 404: 'no category with id 42' })
      }
    },
    validatorCompiler: int64IdValidatorCompiler(app)
  }, async (request) => {
    const id = request.params.id
    const category = await categories.get(id)
    if (category === undefined) throw notFound(`no category with id ${id}`)
    return category
  })
}

export default fp(categories, { name: 'categories', dependencies: ['data'] })
