import { Type, type Static, type TSchema, type TUnsafe } from 'typebox'
import { IDEMPOTENCY_KEY_PATTERN } from '../shared/text-rules.js'

// A schema registered with `app.addSchema`, by reference: the document shows it once under components, the handler
// types still come from the schema. A description describes the use (a response, a body).
export function ref<T extends TSchema & { $id?: string }> (schema: T, options: { description?: string } = {}):
TUnsafe<Static<T>> {
  if (schema.$id === undefined) throw new Error('ref() needs a schema with an $id')
  return Type.Unsafe<Static<T>>({ $ref: `${schema.$id}#`, ...options })
}

/** A JSON integer on the wire, a BigInt in the code (fast-json-stringify writes it exactly). */
export const Int64Id = Type.Unsafe<bigint>({
  type: 'integer',
  format: 'int64',
  minimum: 1,
  description: 'Unique id from a bigserial column; any int64 value up to 9223372036854775807, ' +
    'always an exact JSON integer',
  examples: [1]
})

export const IdempotencyKeyHeaders = Type.Object({
  'idempotency-key': Type.Optional(Type.String({
    minLength: 1,
    maxLength: 255,
    pattern: IDEMPOTENCY_KEY_PATTERN,
    description: 'Makes the request safe to retry: 1 to 255 visible ASCII characters, scoped to your API key, ' +
      'remembered 24 hours. The same key with the same body replays the first answer (Idempotent-Replayed: true); ' +
      'with another body it is 422; while the first request runs it is 409.'
  }))
})

export const NotModified = Type.Unsafe<undefined>({
  type: 'null',
  description: 'Not Modified: the list still has the ETag sent in If-None-Match; no body.'
})
