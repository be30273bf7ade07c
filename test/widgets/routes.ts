import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { errorResponses } from '../../src/http/errors.js'
import { createHandler, listHandler } from '../../src/http/replies.js'
import { IdempotencyKeyHeaders, NotModified, ref } from '../../src/http/schemas.js'
import { NewWidgetSchema, WidgetSchema, type NewWidget, type Widget } from './schemas.js'

const tags = ['widgets']

/** Widgets: a test-only resource, written as docs/architecture.md says to add one (list and create, name only). */
async function widgets (app: FastifyInstance): Promise<void> {
  app.addSchema(NewWidgetSchema)
  app.addSchema(WidgetSchema)
  app.describeTag('widgets', 'Widgets (test only)')
  const widgets = app.collection<NewWidget, Widget>({ name: 'widgets', columns: { name: 'text' }, createOperation: 'createWidget' })
  const api = app.withTypeProvider<TypeBoxTypeProvider>()

  api.get('/v1/widgets', {
    schema: {
      operationId: 'listWidgets',
      summary: 'List every widget',
      tags,
      response: { 200: Type.Array(ref(WidgetSchema)), 304: NotModified, ...errorResponses([401, 429, 500, 503]) }
    }
  }, listHandler(widgets))

  api.post('/v1/widgets', {
    schema: {
      operationId: 'createWidget',
      summary: 'Create a widget',
      tags,
      headers: IdempotencyKeyHeaders,
      body: ref(NewWidgetSchema),
      response: { 201: ref(WidgetSchema), ...errorResponses([400, 401, 409, 413, 415, 422, 429, 500, 503]) }
    }
  }, createHandler(widgets, widget => `/v1/widgets/${widget.id}`))
}

export default fp(widgets, { name: 'widgets', dependencies: ['data'] })
