import { Type, type Static } from 'typebox'
import { withId } from '../http/resource.js'
import { DESCRIPTION_PATTERN, NAME_PATTERN, NO_LONE_SURROGATES } from '../shared/text-rules.js'

const Name = Type.String({
  minLength: 1,
  maxLength: 255,
  pattern: NAME_PATTERN,
  description: 'Display name: 1 to 255 Unicode code points, at least one non-whitespace character, no control ' +
    `characters (C0, DEL, C1; a trailing line feed included). ${NO_LONE_SURROGATES} Stored exactly as sent.`,
  examples: ['Dogs']
})

const Description = Type.String({
  // No minLength 0: it says nothing, and Portman's length fuzzing would send a valid empty description expecting 400.
  maxLength: 2000,
  pattern: DESCRIPTION_PATTERN,
  description: 'Free text: 0 to 2000 Unicode code points; tab, line feed and carriage return are the only control ' +
    `characters allowed. ${NO_LONE_SURROGATES} Stored exactly as sent.`,
  examples: ['Loyal companions']
})

export const NewCategorySchema = Type.Object({
  name: Name,
  description: Type.Optional(Description)
}, { $id: 'NewCategory', title: 'NewCategory', additionalProperties: false })

export const CategorySchema = withId(NewCategorySchema, 'Category')

export type NewCategory = Static<typeof NewCategorySchema>
export type Category = Static<typeof CategorySchema>
