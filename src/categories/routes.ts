import type { FastifyInstance } from 'fastify'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { errorResponses, notFound, validationFailed } from '../http/errors.js'
import { rejectOtherMethods } from '../http/method-not-allowed.js'
import { createHandler, listHandler } from '../http/replies.js'
import { ref } from '../http/shared-schemas.js'
import type { Collection } from '../machinery/collection.js'
import { ID_PATTERN, MAX_ID, patternRules } from '../shared/text-rules.js'
import type { CategoryRepository } from './repository.js'
import { CategoryListSchema, CategoryParamsSchema, CategorySchema, CreateCategoryHeadersSchema, NewCategorySchema, type Category, type NewCategory } from './schemas.js'

const tags = ['categories']
const security = [{ bearer: [] }]

export interface CategoryRouteDeps {
  /** Reads of one category. */
  repository: CategoryRepository
  /** The one write path, and the list it keeps (machinery/collection.ts). */
  categories: Collection<NewCategory, Category>
}

const location = (category: Category): string => `/v1/categories/${category.id}`

export function registerCategoryRoutes (app: FastifyInstance, deps: CategoryRouteDeps): void {
  const api = app.withTypeProvider<TypeBoxTypeProvider>()
  const { repository, categories } = deps

  api.get('/v1/categories', {
    schema: {
      operationId: 'listCategories',
      summary: 'List every category',
      description: 'All categories, ordered by id ascending; no paging. The 200 carries a strong ETag; send it back in If-None-Match to get a 304 while the list is unchanged.',
      tags,
      security,
      response: {
        200: CategoryListSchema,
        304: { type: 'null', description: 'Not Modified: the list still has the ETag sent in If-None-Match; no body.' },
        ...errorResponses(401, 429, 500, 503)
      }
    }
  }, listHandler(categories))

  api.post('/v1/categories', {
    schema: {
      operationId: 'createCategory',
      summary: 'Create a category',
      description: 'Stores the category exactly as sent. A 201 means the row is committed. Send an Idempotency-Key to make retries safe.',
      tags,
      security,
      headers: CreateCategoryHeadersSchema,
      body: ref(NewCategorySchema),
      response: {
        201: ref(CategorySchema, { description: 'Created and committed: the stored category; Location is its URL' }),
        ...errorResponses(400, 401, 409, 413, 415, 422, 429, 500, 503)
      }
    }
  }, createHandler(categories, location))

  api.get('/v1/categories/:id', {
    schema: {
      operationId: 'getCategory',
      summary: 'Get one category',
      description: 'Experimental extension of the interface.',
      'x-stability': 'experimental',
      tags,
      security,
      params: CategoryParamsSchema,
      response: {
        200: ref(CategorySchema, { description: 'The category with this id' }),
        ...errorResponses(400, 401, 404, 429, 500, 503)
      }
    }
  }, async (request) => {
    const id = BigInt(request.params.id)
    if (id > MAX_ID) throw validationFailed(`'id' ${patternRules[ID_PATTERN] ?? ''}`)
    const category = await repository.get(id)
    if (category === undefined) throw notFound(`no category with id ${id}`)
    return category
  })

  rejectOtherMethods(app, '/v1/categories', ['GET', 'POST'])
  rejectOtherMethods(app, '/v1/categories/:id', ['GET'])
}
