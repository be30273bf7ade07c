import type { FastifyInstance } from 'fastify'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { errorResponses, notFound, validationFailed } from '../http/errors.js'
import { rejectOtherMethods } from '../http/method-not-allowed.js'
import { ref } from '../http/shared-schemas.js'
import type { CategoryCreateBatcher } from './create-batcher.js'
import { ifNoneMatchHits, type CategoryListCache, type ListSerializer } from './list-cache.js'
import type { CategoryRepository } from './repository.js'
import { CategoryListSchema, CategoryParamsSchema, CategorySchema, MAX_ID, NewCategorySchema, patternRules, ID_PATTERN } from './schemas.js'

const tags = ['categories']
const security = [{ bearer: [] }]

export interface CategoryRouteDeps {
  categories: CategoryRepository
  creates: CategoryCreateBatcher
  listCache: CategoryListCache
}

export function registerCategoryRoutes (app: FastifyInstance, deps: CategoryRouteDeps): void {
  const api = app.withTypeProvider<TypeBoxTypeProvider>()
  const { categories, creates, listCache } = deps

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
  }, async (request, reply) => {
    // The route's own compiled 200 serializer: the cached body is exactly what the schema would produce.
    const list = await listCache.read(reply.getSerializationFunction('200') as unknown as ListSerializer)
    reply.header('cache-control', 'no-cache').header('etag', list.etag)
    if (ifNoneMatchHits(request.headers['if-none-match'], list.etag)) return await reply.code(304).send()
    return await reply.header('content-type', 'application/json; charset=utf-8').send(list.body as never)
  })

  api.post('/v1/categories', {
    schema: {
      operationId: 'createCategory',
      summary: 'Create a category',
      description: 'Stores the category exactly as sent. A 201 means the row is committed.',
      tags,
      security,
      body: ref(NewCategorySchema),
      response: {
        201: ref(CategorySchema),
        ...errorResponses(400, 401, 413, 415, 429, 500, 503)
      }
    }
  }, async (request, reply) => {
    const category = await creates.create(request.body)
    // Committed: the next list read on this instance must see it, whatever the change feed is doing.
    listCache.invalidate()
    return await reply.code(201).header('location', `/v1/categories/${category.id}`).send(category)
  })

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
        200: ref(CategorySchema),
        ...errorResponses(400, 401, 404, 429, 500, 503)
      }
    }
  }, async (request) => {
    const id = BigInt(request.params.id)
    if (id > MAX_ID) throw validationFailed(`'id' ${patternRules[ID_PATTERN] ?? ''}`)
    const category = await categories.get(id)
    if (category === undefined) throw notFound(`no category with id ${id}`)
    return category
  })

  rejectOtherMethods(app, '/v1/categories', ['GET', 'POST'])
  rejectOtherMethods(app, '/v1/categories/:id', ['GET'])
}
