import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import fastJson from 'fast-json-stringify'
import { Type, type TObject, type TProperties, type TSchema } from 'typebox'
import { columnsOf, type Row } from '../db/table.js'
import { MALFORMED_JSON, errorForStatus, errorResponses } from './errors.js'
import { parseJsonBody } from './json-body.js'
import { createHandler, deleteHandler, getHandler, listHandler, preconditionMessage, updateHandler } from './replies.js'
import { IdempotencyKeyHeaders, Int64Id, NotModified, ref } from './schemas.js'
import { Int64IdParams, PageQuery, integerMessage, urlIntegersValidatorCompiler } from './url-integers.js'

type Operation = 'list' | 'create' | 'get' | 'update' | 'delete'

export interface Resource<P extends TProperties> {
  /** The table, the path (/v1/<name>) and the tag: lower case, plural. */
  name: string
  singular: string
  description: string // the tag's
  /** The create body, with an $id (NewCategory); its members are the table's columns. */
  create: TObject<P>
  /** withId(create, 'Category') */
  item: TItem<NoInfer<P>>
  /** Operations beyond list and create default to experimental. */
  stability?: Partial<Record<Operation, 'experimental' | 'beta'>>
}

type TItem<P extends TProperties> = TObject<{ id: typeof Int64Id } & P>

export function withId<P extends TProperties> (create: TObject<P>, $id: string): TItem<P> {
  return Type.Object({ id: Int64Id, ...create.properties }, { $id, title: $id, additionalProperties: false })
}

const MERGE_PATCH = 'application/merge-patch+json'

/**
 * The create body as a JSON merge patch (RFC 7396): every member optional; a member the create body may leave out
 * may be null, which removes it; a required one may not.
 */
function patchOf (create: TObject, $id: string): TObject {
  const required = new Set((create as { required?: string[] }).required ?? [])
  const members = Object.entries(create.properties as Record<string, TSchema & { type?: string }>)
    .map(([name, member]) => [name, Type.Optional(required.has(name)
      ? member
      : Type.Unsafe({ ...member, type: [member.type, 'null'] }))])
  return Type.Object(Object.fromEntries(members), {
    $id,
    title: $id,
    additionalProperties: false,
    description: `A JSON merge patch of ${idOf(create)}: members sent replace the stored ones, members left out ` +
      'stay, and null removes an optional member.'
  })
}

const ETag = (description: string): object => ({ etag: { type: 'string', description } })
const ItemTag = ETag('Strong: the version of this row; send it in If-Match to change the row only as read')
const IfMatchHeaders = Type.Object({
  'if-match': Type.Optional(Type.String({
    description: 'The ETag of the row as read (or *): the write happens only if the row is still that version, ' +
      'else 412 and nothing changes',
    examples: ['*']
  }))
})

const capitalized = (word: string): string => word.charAt(0).toUpperCase() + word.slice(1)
const idOf = (schema: TObject): string => String((schema as { $id?: string }).$id)

export function resource<P extends TProperties> (declared: Resource<P>) {
  const { name, singular, create, item } = declared
  const stability: Resource<P>['stability'] = {
    get: 'experimental',
    update: 'experimental',
    delete: 'experimental',
    ...declared.stability
  }
  const path = `/v1/${name}`
  const itemName = idOf(item)
  const patch = patchOf(create, `${itemName}Patch`)
  const required = (create as { required?: string[] }).required?.[0] ?? ''
  const missing = `request body is missing the required member '${required}'`
  const schema = (operation: Operation, operationId: string, summary: string, description: string): object =>
    ({ operationId, summary, description, tags: [name], 'x-stability': stability[operation] })
  const notFoundExample = `no ${singular} with id 42`
  const invalidId = integerMessage('id', Int64IdParams.properties.id)

  return fp(async function plugin (app: FastifyInstance): Promise<void> {
    app.addSchema(create)
    app.addSchema(item)
    app.addSchema(patch)
    app.describeTag(name, declared.description)
    // The routes' schemas validate and serialize; the declaration's types checked the schemas themselves.
    const collection = app.collection<Record<string, unknown>, Row & Record<string, unknown>>({
      name, columns: columnsOf(create), createOperation: `create${itemName}`, serialize: fastJson(item as object)
    })
    const validatorCompiler = urlIntegersValidatorCompiler(app)

    app.get(path, {
      schema: {
        ...schema('list', `list${capitalized(name)}`, `List every ${singular}, or a page`,
          `All ${name}, ordered by id ascending. The 200 carries a strong ETag; send it back in If-None-Match to ` +
          'get a 304 while the list is unchanged. With limit (and after, the last id of the page before): a page ' +
          'of the same list, with a Link header to the next page while rows follow it; a page carries no ETag.'),
        querystring: PageQuery,
        response: {
          200: {
            ...Type.Array(ref(item), { description: `Every ${singular}, or a page of them, ordered by id ascending` }),
            headers: {
              ...ETag('Strong, of the whole list (not sent with a page)'),
              link: { type: 'string', description: 'With a page, while rows follow it: <the next page>; rel="next"' }
            }
          },
          304: NotModified,
          ...errorResponses([400, 401, 429, 500, 503], { 400: integerMessage('limit', PageQuery.properties.limit) })
        }
      },
      validatorCompiler
    }, listHandler(collection, path))

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

    app.get(`${path}/:id`, {
      schema: {
        ...schema('get', `get${itemName}`, `Get one ${singular}`,
          `The ${singular} with this id, with its ETag; If-None-Match with it gives a 304 while it is unchanged.`),
        params: Int64IdParams,
        response: {
          200: { ...ref(item, { description: `The ${singular} with this id` }), headers: ItemTag },
          304: NotModified,
          ...errorResponses([400, 401, 404, 429, 500, 503], { 400: invalidId, 404: notFoundExample })
        }
      },
      validatorCompiler
    }, getHandler(collection, singular))

    // Its own scope: a merge patch is a body of this route only.
    await app.register(async function patchScope (scope) {
      scope.addContentTypeParser(MERGE_PATCH, { parseAs: 'buffer' }, parseJsonBody)
      scope.addContentTypeParser('*', async () => {
        throw errorForStatus(415, `Content-Type must be ${MERGE_PATCH} or application/json`)
      })
      scope.patch(`${path}/:id`, {
        schema: {
          ...schema('update', `update${itemName}`, `Update a ${singular}`,
            `A JSON merge patch (RFC 7396) of ${idOf(create)}: members sent replace the stored ones, members left ` +
            'out stay, null removes an optional member. With If-Match, only if the row is still that version. ' +
            `The 200 is the whole updated ${singular} and its new ETag.`),
          params: Int64IdParams,
          headers: IfMatchHeaders,
          consumes: [MERGE_PATCH, 'application/json'],
          body: ref(patch),
          response: {
            200: { ...ref(item, { description: `The ${singular} as updated and committed` }), headers: ItemTag },
            ...errorResponses([400, 401, 403, 404, 412, 413, 415, 429, 500, 503], {
              400: invalidId, 404: notFoundExample, 412: preconditionMessage(singular, 42n)
            })
          }
        },
        validatorCompiler
      }, updateHandler(collection, singular))
    })

    // Its own scope: a DELETE takes no body, and an empty one is none whatever its Content-Type (clients that send
    // a JSON Content-Type with every request send one with a DELETE too).
    await app.register(async function deleteScope (scope) {
      scope.removeAllContentTypeParsers()
      scope.addContentTypeParser('*', { parseAs: 'buffer' }, async (_request: unknown, body: Buffer) => {
        if (body.length > 0) throw errorForStatus(415, 'a DELETE takes no body')
        return undefined
      })
      scope.delete(`${path}/:id`, {
        schema: {
          ...schema('delete', `delete${itemName}`, `Delete a ${singular}`,
            `Deletes the ${singular}; its id is never used again. With If-Match, only if the row is still that ` +
            'version. No body.'),
          params: Int64IdParams,
          headers: IfMatchHeaders,
          response: {
            204: { type: 'null', description: 'Deleted and committed; no body' },
            ...errorResponses([400, 401, 403, 404, 412, 415, 429, 500, 503], {
              400: invalidId,
              404: notFoundExample,
              412: preconditionMessage(singular, 42n),
              415: 'a DELETE takes no body'
            })
          }
        },
        validatorCompiler
      }, deleteHandler(collection, singular))
    })
  }, { name, dependencies: ['data', 'openapi'] })
}
