import { resource } from '../../src/http/resource.js'
import { NewWidgetSchema, WidgetSchema } from './schemas.js'

export default resource({
  name: 'widgets',
  singular: 'widget',
  description: 'Widgets (test only)',
  create: NewWidgetSchema,
  item: WidgetSchema
})
