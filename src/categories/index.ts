import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { Collection } from '../machinery/collection.js'
import { digestOf } from '../machinery/idempotency.js'
import { CategoryRepository } from './repository.js'
import { registerCategoryRoutes } from './routes.js'
import { CategorySchema, NewCategorySchema, type Category, type NewCategory } from './schemas.js'

/** The channel the categories table's trigger notifies (migrations/*categories-notify*.sql). */
export const CATEGORIES_CHANNEL = 'categories_changed'

/** The body as createCategory understands it: the same category sent with other spacing or member order is the same body. */
export const categoryRequestHash = (category: NewCategory): Buffer => digestOf([category.name, category.description ?? null])

/**
 * Categories: their schemas, repository, write path (one Collection: every create
 * goes through it, and it keeps the cached list in step) and routes. What it
 * needs of the service comes from the `data` plugin (pool, change feed,
 * Idempotency-Key store); what it starts, the data plugin stops.
 */
async function categories (app: FastifyInstance): Promise<void> {
  for (const schema of [NewCategorySchema, CategorySchema]) app.addSchema(schema)
  const repository = new CategoryRepository(app.pool)
  const collection = new Collection<NewCategory, Category>({
    repository,
    feed: app.changeFeed,
    channel: CATEGORIES_CHANNEL,
    idempotency: app.idempotency,
    createOperation: 'createCategory',
    requestHash: categoryRequestHash,
    // Metric names as they have always been (dashboards and alerts use them).
    metricPrefix: 'categories',
    rowName: 'Category',
    registry: app.metrics
  })
  registerCategoryRoutes(app, { repository, categories: collection })
}

export default fp(categories, { name: 'categories', dependencies: ['data'] })
