import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { Type, type TObject, type TProperties } from 'typebox'
import { columnsOf, type Row } from '../db/table.js'
import { MALFORMED_JSON, errorResponses } from './errors.js'
import { INVALID_ID, Int64IdParams, int64IdValidatorCompiler } from './int64-id.js'
import { createHandler, getHandler, listHandler } from './replies.js'
import { IdempotencyKeyHeaders, Int64Id, NotModified, ref } from './schemas.js'

type Operation = 'list' | 'create' | 'get'

export interface Resource<P extends TProperties> {
  /** The table, the path (/v1/<name>) and the tag: lower case, plural. */
  name: string
  singular: string
  description: string // the tag's
  /** The create body, with an $id (NewCategory); its members are the table's columns. */
  create: TObject<P>
  /** withId(create, 'Category') */
  item: TItem<NoInfer<P>>
  stability?: Partial<Record<Operation, 'experimental' | 'beta'>>
}

type TItem<P extends TProperties> = TObject<{ id: typeof Int64Id } & P>

export function withId<P extends TProperties> (create: TObject<P>, $id: string): TItem<P> {
  return Type.Object({ id: Int64Id, ...create.properties }, { $id, title: $id, additionalProperties: false })
}

const capitalized = (word: string): string => word.charAt(0).toUpperCase() + word.slice(1)
const idOf = (schema: TObject): string => String((schema as { $id?: string }).$id)

export function resource<P extends TProperties> (declared: Resource<P>) {
  const { name, singular, create, item, stability = {} } = declared
  const path = `/v1/${name}`
  const itemName = idOf(item)
  const required = (create as { required?: string[] }).required?.[0] ?? ''
  const missing = `request body is missing the required member '${required}'`
  const schema = (operation: Operation, operationId: string, summary: string, description: string): object =>
    ({ operationId, summary, description, tags: [name], 'x-stability': stability[operation] })

  return fp(async function plugin (app: FastifyInstance): Promise<void> {
    app.addSchema(create)
    app.addSchema(item)
    app.describeTag(name, declared.description)
    // The routes' schemas validate and serialize; the declaration's types checked the schemas themselves.
    const collection = app.collection<Record<string, unknown>, Row & Record<string, unknown>>({
      name, columns: columnsOf(create), createOperation: `create${itemName}`
    })

    app.get(path, {
      schema: {
        ...schema('list', `list${capitalized(name)}`, `List every ${singular}`,
          `All ${name}, ordered by id ascending; no paging. The 200 carries a strong ETag; send it back in ` +
          'If-None-Match to get a 304 while the list is unchanged.'),
        response: {
          200: Type.Array(ref(item), { description: `Every ${singular}, ordered by id ascending` }),
          304: NotModified,
          ...errorResponses([401, 429, 500, 503])
        }
      }
    }, listHandler(collection))

    app.post(path, {
      schema: {
        ...schema('create', `create${itemName}`, `Create a ${singular}`,
          `Stores the ${singular} exactly as sent. A 201 means the row is committed. ` +
          'Send an Idempotency-Key to make retries safe.'),
        headers: IdempotencyKeyHeaders,
        body: ref(create),
        response: {
          201: ref(item, { description: `Created and committed: the stored ${singular}; Location is its URL` }),
          ...errorResponses([400, 401, 403, 409, 413, 415, 422, 429, 500, 503], {
            400: [[`A rule of ${idOf(create)} is broken`, 'VALIDATION_FAILED', missing],
              ['The body is not JSON', MALFORMED_JSON, 'request body is not valid JSON']]
          })
        }
      }
    }, createHandler(collection, path))

    app.get<{ Params: { id: bigint } }>(`${path}/:id`, {
      schema: {
        ...schema('get', `get${itemName}`, `Get one ${singular}`, `The ${singular} with this id.`),
        params: Int64IdParams,
        response: {
          200: ref(item, { description: `The ${singular} with this id` }),
          ...errorResponses([400, 401, 404, 429, 500, 503], { 400: INVALID_ID, 404: `no ${singular} with id 42` })
        }
      },
      validatorCompiler: int64IdValidatorCompiler(app)
    }, getHandler(collection, singular))
  }, { name, dependencies: ['data', 'openapi'] })
}
