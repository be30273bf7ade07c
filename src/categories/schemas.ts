import { Type, type Static } from '@sinclair/typebox'
import { ref } from '../http/shared-schemas.js'

/*
 * The text rules of NewCategory (docs/api.md), as JSON Schema patterns. Ajv compiles
 * patterns with the `u` flag, so \p{Cs} matches exactly the lone surrogates
 * (a valid pair is one astral code point) and lengths count code points.
 */

/** name: no control characters at all, no lone surrogates, at least one non-whitespace character. */
export const NAME_PATTERN = '^(?=[\\s\\S]*\\S)[^\\p{Cc}\\p{Cs}]*$'
/** description: no control characters except tab, line feed and carriage return; no lone surrogates. */
export const DESCRIPTION_PATTERN = '^[^\\p{Cs}\\u0000-\\u0008\\u000B\\u000C\\u000E-\\u001F\\u007F-\\u009F]*$'
/** A canonical decimal id (no sign, no leading zero); the upper bound 2^63-1 is checked as a BigInt. */
export const ID_PATTERN = '^[1-9][0-9]{0,18}$'
export const MAX_ID = 9223372036854775807n
/** Idempotency-Key: visible ASCII only (the length, 1 to 255, is checked beside it). */
export const IDEMPOTENCY_KEY_PATTERN = '^[\\x21-\\x7E]+$'

/** What a pattern means, in words, for 400 messages. Keyed by the pattern itself. */
export const patternRules: Record<string, string> = {
  [NAME_PATTERN]: 'must contain at least one non-whitespace character and no control characters, NUL or lone surrogates',
  [DESCRIPTION_PATTERN]: 'must not contain NUL, lone surrogates or control characters other than tab, line feed and carriage return',
  [ID_PATTERN]: 'must be a decimal integer from 1 to 9223372036854775807',
  [IDEMPOTENCY_KEY_PATTERN]: 'must be 1 to 255 visible ASCII characters'
}

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
