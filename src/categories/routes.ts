import type { FastifyInstance } from 'fastify'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { errorResponses, notFound, validationFailed } from '../http/errors.js'
import { rejectOtherMethods } from '../http/method-not-allowed.js'
import { ref } from '../http/shared-schemas.js'
import type { CategoryRepository } from './repository.js'
import { CategoryListSchema, CategoryParamsSchema, CategorySchema, MAX_ID, NewCategorySchema, patternRules, ID_PATTERN } from './schemas.js'

const tags = ['categories']
const security = [{ bearer: [] }]

export function registerCategoryRoutes (app: FastifyInstance, deps: { categories: CategoryRepository }): void {
  const api = app.withTypeProvider<TypeBoxTypeProvider>()
  const { categories } = deps

  api.get('/v1/categories', {
    schema: {
      operationId: 'listCategories',
      summary: 'List every category',
      description: 'All categories, ordered by id ascending; no paging.',
      tags,
      security,
      response: {
        200: CategoryListSchema,
        ...errorResponses(401, 429, 500, 503)
      }
    }
  }, async (_request, reply) => {
    reply.header('cache-control', 'no-cache')
    return await categories.list()
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
    const category = await categories.create(request.body)
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
