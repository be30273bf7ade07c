import type { FastifyInstance } from 'fastify'
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { ApiError, errorResponses, notFound, validationFailed } from '../http/errors.js'
import { rejectOtherMethods } from '../http/method-not-allowed.js'
import { ref } from '../http/shared-schemas.js'
import type { CategoryCreateBatcher } from './create-batcher.js'
import { requestHash, type IdempotencyStore, type Outcome } from './idempotency.js'
import { ifNoneMatchHits, type CategoryListCache, type ListSerializer, type SerializedList } from './list-cache.js'
import type { CategoryRepository } from './repository.js'
import { ID_PATTERN, MAX_ID, patternRules } from '../shared/text-rules.js'
import { CategoryListSchema, CategoryParamsSchema, CategorySchema, CreateCategoryHeadersSchema, NewCategorySchema, type Category } from './schemas.js'

const tags = ['categories']
const security = [{ bearer: [] }]

export interface CategoryRouteDeps {
  categories: CategoryRepository
  creates: CategoryCreateBatcher
  listCache: CategoryListCache
  idempotency: IdempotencyStore
}

export function registerCategoryRoutes (app: FastifyInstance, deps: CategoryRouteDeps): void {
  const api = app.withTypeProvider<TypeBoxTypeProvider>()
  const { categories, creates, listCache, idempotency } = deps

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
  }, (request, reply) => {
    const sendList = (list: SerializedList): void => {
      reply.header('cache-control', 'no-cache').header('etag', list.etag)
      if (ifNoneMatchHits(request.headers['if-none-match'], list.etag)) reply.code(304).send()
      else reply.header('content-type', 'application/json; charset=utf-8').send(list.body)
    }
    // A cache hit is answered at once, with no promise for Fastify to wait for.
    const hit = listCache.cached()
    if (hit !== undefined) {
      sendList(hit)
      return
    }
    // The route's own compiled 200 serializer: the cached body is exactly what the schema would produce.
    return listCache.read(reply.getSerializationFunction('200') as unknown as ListSerializer).then(sendList)
  })

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
  }, async (request, reply) => {
    const location = (category: Category): string => `/v1/categories/${category.id}`
    const key = request.headers['idempotency-key']
    if (key === undefined) {
      // Committed, and already in this instance's list (the batcher told the list cache before answering).
      const category = await creates.create(request.body)
      return await reply.code(201).header('location', location(category)).send(category)
    }

    // With an Idempotency-Key the row and the remembered answer commit together (one transaction, no batching).
    const serialize = reply.getSerializationFunction('201') as unknown as (category: Category) => string
    let outcome: Outcome<{ category: Category, body: string }>
    try {
      outcome = await idempotency.execute(request.apiKeyDigest as Buffer, key, requestHash(request.body), async client => {
        const category = await categories.insertWith(client, request.body)
        const body = serialize(category)
        return { result: { category, body }, response: { status: 201, body, location: location(category) } }
      })
    } catch (err) {
      // A refusal (409, 422) wrote nothing; any other failure may have committed before its answer was lost.
      if (!(err instanceof ApiError && err.status < 500)) listCache.createFailed()
      throw err
    }
    if (outcome.kind === 'replay') {
      const { status, body, location: stored } = outcome.response
      if (stored !== null) reply.header('location', stored)
      return await reply.code(status as 201).header('idempotent-replayed', 'true').header('content-type', 'application/json; charset=utf-8').send(body as never)
    }
    // Committed: the next list read on this instance must see it, whatever the change feed is doing.
    const created = outcome.result
    listCache.created([created.category])
    return await reply.code(201).header('location', location(created.category)).header('content-type', 'application/json; charset=utf-8').send(created.body as never)
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
        200: ref(CategorySchema, { description: 'The category with this id' }),
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
