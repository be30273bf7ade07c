import t from 'tap'
import { Type } from 'typebox'
import { NewCategorySchema } from '../../src/categories/schemas.js'
import { columnsOf } from '../../src/db/table.js'
import { resource, withId } from '../../src/http/resource.js'

/*
 * A resource is one declaration (src/http/resource.ts): its table's columns and its TypeScript types follow
 * from the create body's schema, so a member cannot be forgotten and a mismatch fails the type check.
 */

t.test("the create body's members are the columns, each with the SQL type of its schema", async t => {
  t.same(columnsOf(NewCategorySchema), { name: 'text', description: 'text' })
  const members = Type.Object({
    a: Type.String(),
    n: Type.Integer(),
    b: Type.Boolean(),
    x: Type.Optional(Type.Number())
  })
  t.same(columnsOf(members), { a: 'text', n: 'bigint', b: 'boolean', x: 'double precision' })
  t.throws(
    () => columnsOf(Type.Object({ tags: Type.Array(Type.String()) })),
    /member tags: no column for its schema/,
    'a member no column can hold is refused when the resource is declared, not dropped'
  )
  t.throws(() => columnsOf(Type.Object({ 'bad-name': Type.String() })), /member bad-name/)
})

t.test('an item schema other than the create body plus an id fails the type check', async t => {
  const NewThing = Type.Object({ name: Type.String(), size: Type.Integer() }, { $id: 'NewThing' })
  const Forgetful = Type.Object({ name: Type.String() }, { $id: 'NewForgetful' })
  const wrong = resource({
    name: 'things',
    singular: 'thing',
    description: 'Things',
    create: NewThing,
    // @ts-expect-error the item lacks `size`: if this compiled, `npm run typecheck` would fail on the unused directive
    item: withId(Forgetful, 'Thing')
  })
  const right = resource({
    name: 'things',
    singular: 'thing',
    description: 'Things',
    create: NewThing,
    item: withId(NewThing, 'Thing')
  })
  t.type(wrong, 'function')
  t.type(right, 'function')
})
