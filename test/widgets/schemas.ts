import { Type, type Static } from 'typebox'
import { Int64Id } from '../../src/http/schemas.js'
import { NAME_PATTERN } from '../../src/shared/text-rules.js'

const Name = Type.String({ minLength: 1, maxLength: 100, pattern: NAME_PATTERN, description: 'A widget\'s name' })

export const NewWidgetSchema = Type.Object({ name: Name }, { $id: 'NewWidget', additionalProperties: false })
export const WidgetSchema = Type.Object({ id: Int64Id, name: Name }, { $id: 'Widget', additionalProperties: false })

export type NewWidget = Static<typeof NewWidgetSchema>
export type Widget = Static<typeof WidgetSchema>
