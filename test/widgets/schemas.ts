import { Type } from 'typebox'
import { withId } from '../../src/http/resource.js'
import { NAME_PATTERN } from '../../src/shared/text-rules.js'

const Name = Type.String({ minLength: 1, maxLength: 100, pattern: NAME_PATTERN, description: 'A widget\'s name' })

export const NewWidgetSchema = Type.Object({ name: Name }, { $id: 'NewWidget', additionalProperties: false })
export const WidgetSchema = withId(NewWidgetSchema, 'Widget')
