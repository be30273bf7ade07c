import { Type, type Static, type TSchema, type TUnsafe } from '@sinclair/typebox'

/**
 * A reference to a schema registered with `app.addSchema` (it must have an $id):
 * the OpenAPI document shows it once under components, and the handler types
 * still come from the schema itself.
 */
export function ref<T extends TSchema> (schema: T): TUnsafe<Static<T>> {
  if (schema.$id === undefined) throw new Error('ref() needs a schema with an $id')
  return Type.Unsafe<Static<T>>({ $ref: `${schema.$id}#` })
}
