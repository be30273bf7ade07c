import { Type, type Static } from '@sinclair/typebox'
import { ref } from '../http/shared-schemas.js'
// The text rules, shared with the error handler that words a failed pattern.
import { DESCRIPTION_PATTERN, ID_PATTERN, IDEMPOTENCY_KEY_PATTERN, NAME_PATTERN } from '../shared/text-rules.js'

const Name = Type.String({
  minLength: 1,
  maxLength: 255,
  pattern: NAME_PATTERN,
  description: 'Display name: 1 to 255 Unicode code points, at least one non-whitespace character, no control characters. Stored exactly as sent.',
  examples: ['Dogs']
})

const Description = Type.String({
  minLength: 0,
  maxLength: 2000,
  pattern: DESCRIPTION_PATTERN,
  description: 'Free text: 0 to 2000 Unicode code points; tab, line feed and carriage return are the only control characters allowed. Stored exactly as sent.',
  examples: ['Loyal companions']
})

/** An int64 id: a JSON integer on the wire, a BigInt in the code (fast-json-stringify writes it exactly). */
export const CategoryId = Type.Unsafe<bigint>({
  type: 'integer',
  format: 'int64',
  minimum: 1,
  description: 'Unique id from a bigserial column; any int64 value up to 9223372036854775807, always an exact JSON integer',
  examples: [1]
})

export const NewCategorySchema = Type.Object({
  name: Name,
  description: Type.Optional(Description)
}, { $id: 'NewCategory', title: 'NewCategory', additionalProperties: false })

export const CategorySchema = Type.Object({
  id: CategoryId,
  name: Name,
  description: Type.Optional(Description)
}, { $id: 'Category', title: 'Category', additionalProperties: false })

export const CategoryListSchema = Type.Array(ref(CategorySchema), {
  description: 'Every category, ordered by id ascending'
})

export const CategoryParamsSchema = Type.Object({
  id: Type.String({ pattern: ID_PATTERN, description: 'Category id, a decimal integer from 1 to 9223372036854775807' })
}, { additionalProperties: false })

export type NewCategory = Static<typeof NewCategorySchema>
export type Category = Static<typeof CategorySchema>

export const CreateCategoryHeadersSchema = Type.Object({
  'idempotency-key': Type.Optional(Type.String({
    minLength: 1,
    maxLength: 255,
    pattern: IDEMPOTENCY_KEY_PATTERN,
    description: 'Makes the request safe to retry: 1 to 255 visible ASCII characters, scoped to your API key, remembered 24 hours. The same key with the same body replays the first answer (Idempotent-Replayed: true); with another body it is 422; while the first request runs it is 409.'
  }))
})
