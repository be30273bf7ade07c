import { resource } from '../http/resource.js'
import { CategorySchema, NewCategorySchema } from './schemas.js'

export default resource({
  name: 'categories',
  singular: 'category',
  description: 'Categories of pets',
  create: NewCategorySchema,
  item: CategorySchema
})
