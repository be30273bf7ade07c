import { Type, type Static, type TSchema, type TUnsafe } from '@sinclair/typebox'

/**
 * A reference to a schema registered with `app.addSchema` (it must have an $id):
 * the OpenAPI document shows it once under components, and the handler types
 * still come from the schema itself. A description describes the use (a response, a body).
 */
export function ref<T extends TSchema> (schema: T, options: { description?: string } = {}): TUnsafe<Static<T>> {
  if (schema.$id === undefined) throw new Error('ref() needs a schema with an $id')
  return Type.Unsafe<Static<T>>({ $ref: `${schema.$id}#`, ...options })
}
