import { readFileSync } from 'node:fs'
import t from 'tap'
import { testApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

/*
 * The Postman collection served beside the document holds, for every operation the served
 * document lists, the tests users are told it holds. `npm run api:check` (test/interface/api-document.test.ts)
 * keeps the committed file current with the document; `npm run test:postman` runs it against a
 * live instance.
 */

const db = await testDatabase(t)
const { app } = await testApp(t, db.url)

const served = await app.inject({ method: 'GET', url: '/docs/petstore.postman_collection.json' })

interface Item {
  name: string
  item?: Item[]
  request?: {
    method: string
    url: { path: string[]; variable?: Array<{ key: string; value: string }> }
    body?: { raw?: string }
  }
  event?: Array<{ listen: string; script: { exec: string[] } }>
}
const collection = served.json() as {
  info: { name: string }
  auth: { type: string }
  variable: Array<{ key: string; value: string }>
  item: Item[]
}
const requests = (items: Item[]): Item[] =>
  items.flatMap(item => (item.item === undefined ? [item] : requests(item.item)))
const all = requests(collection.item)
const tests = (item: Item): string =>
  item.event
    ?.filter(e => e.listen === 'test')
    .flatMap(e => e.script.exec)
    .join('\n') ?? ''

type Schema = {
  type?: string | string[]
  $ref?: string
  properties?: Record<string, Schema>
  required?: string[]
  minLength?: number
  maxLength?: number
}
interface Operation {
  summary: string
  operationId: string
  tags?: string[]
  responses: Record<string, unknown>
  requestBody?: { content: Record<string, { schema: Schema }> }
}
const doc = (await app.inject({ method: 'GET', url: '/docs/openapi.json' })).json() as {
  paths: Record<string, Record<string, Operation>>
  components: { schemas: Record<string, Schema> }
}
/** Every operation of the served document: the collection names its request by the summary. */
const operations = Object.entries(doc.paths).flatMap(([path, item]) =>
  Object.entries(item).map(([method, op]) => ({ path, method, op }))
)
/** An operation's JSON body schema, its $ref resolved. */
const bodyOf = (op: Operation): Schema | undefined => {
  const schema = op.requestBody?.content['application/json']?.schema
  return schema?.$ref === undefined ? schema : doc.components.schemas[schema.$ref.split('/').at(-1) ?? '']
}
const pascal = (name: string): string => name.charAt(0).toUpperCase() + name.slice(1)
/** The operations of today's contract, by summary: whatever else the document lists, these stay. */
const CONTRACT = [
  'Create a category',
  'List every category, or a page',
  'Get one category (experimental)',
  'Update a category (experimental)',
  'Delete a category (experimental)',
  'Get a pet (deprecated placeholder)',
  'List store orders (placeholder)'
]

t.test('served like the document: no key needed, JSON, offered as a download', async t => {
  t.equal(served.statusCode, 200)
  t.match(served.headers['content-type'], /^application\/json/)
  t.match(served.headers['content-disposition'], /attachment; filename="petstore\.postman_collection\.json"/)
  t.equal(collection.info.name, 'Petstore API')
  t.equal(collection.auth.type, 'bearer', "the key is the collection's bearer token ({{bearerToken}})")
  t.ok(
    collection.variable.some(v => v.key === 'baseUrl'),
    'the deployment is the baseUrl variable'
  )
})

t.test('it is the committed file, byte for byte (npm run api:check keeps that current with the document)', async t => {
  t.ok(
    served.body === readFileSync('src/http/petstore.postman_collection.json', 'utf8'),
    'run `npm run api:generate` and commit'
  )
})

t.test('contract tests on every operation of the document: status, content type, JSON body, schema', async t => {
  const main = all.filter(item => !/\[/.test(item.name))
  t.same(
    main.map(item => item.name).sort(),
    operations.map(({ op }) => op.summary).sort(),
    'one request per operation, named by its summary'
  )
  for (const name of CONTRACT) {
    t.ok(
      main.some(item => item.name === name),
      name
    )
  }
  for (const { op } of operations) {
    const item = main.find(i => i.name === op.summary)
    const script = item === undefined ? '' : tests(item)
    const succeeds = Object.keys(op.responses).some(status => status.startsWith('2'))
    t.ok(succeeds || op.responses['501'] !== undefined, `${op.summary}: a success, or the 501 of a placeholder`)
    t.match(script, succeeds ? /Status code is 2xx/ : /Response status code is 501/, `${op.summary}: status`)
    if (op.responses['204'] !== undefined) {
      t.match(script, /to\.not\.be\.withBody/, `${op.summary}: no body`)
      continue
    }
    t.match(script, /Content-Type is application\/json/, `${op.summary}: content type`)
    t.match(script, /to\.have\.jsonBody\(\)/, `${op.summary}: JSON body`)
    t.match(script, /to\.have\.jsonSchema\(schema/, `${op.summary}: schema`)
  }
})

t.test(
  "a get, update or delete by id uses the id its folder's create answered (never a stored row), in that order",
  async t => {
    const byId = operations.filter(({ path }) => path.endsWith('/{id}'))
    for (const path of new Set(byId.map(o => o.path))) {
      t.same(
        byId
          .filter(o => o.path === path)
          .map(({ method }) => method)
          .sort(),
        ['delete', 'get', 'patch'],
        path
      )
    }
    for (const { method, path, op } of byId) {
      const tag = op.tags?.[0] ?? ''
      const create = operations.find(o => o.method === 'post' && o.op.tags?.[0] === tag)
      if (create === undefined) continue
      const folder = collection.item.find(folder => folder.name === tag)?.item ?? []
      const at = folder.findIndex(i => i.name === op.summary)
      const post = folder.findIndex(i => i.name === create.op.summary)
      t.ok(post >= 0 && post < at, `${create.op.summary} runs before ${op.summary}`)
      t.same(
        folder[at]?.request?.url.variable?.find(v => v.key === 'id')?.value,
        `{{${tag}Id}}`,
        `${method} ${path}: {{${tag}Id}}`
      )
      t.match(
        tests(folder[post] as Item),
        `pm.collectionVariables.set("${tag}Id", jsonData.id)`,
        `${create.path}: sets ${tag}Id`
      )
    }
    const folder = collection.item.find(folder => folder.name === 'categories')?.item ?? []
    const order = ['getCategory', 'updateCategory', 'deleteCategory'].map(id =>
      folder.findIndex(i => i.name === byId.find(o => o.op.operationId === id)?.op.summary)
    )
    t.same(
      order,
      [...order].sort((x, y) => x - y),
      'get, then update, then delete'
    )
  }
)

t.test('variations: no key, a wrong key, a missing member, wrong types, and length fuzzing', async t => {
  const names = all.map(item => item.name)
  for (const { op } of operations) {
    t.ok(names.includes(`${op.summary}[NoKey]`), `${op.summary} without a key`)
    t.ok(names.includes(`${op.summary}[WrongKey]`), `${op.summary} with a wrong key`)
  }
  for (const operation of CONTRACT) {
    t.ok(names.includes(`${operation}[NoKey]`) && names.includes(`${operation}[WrongKey]`), `${operation}: both`)
  }
  const variations: string[] = []
  for (const { method, op } of operations) {
    const body = bodyOf(op)
    if (body?.properties === undefined) continue
    const members = Object.entries(body.properties)
    for (const member of body.required ?? []) variations.push(`${op.summary}[Missing${pascal(member)}]`)
    for (const [member, schema] of members) {
      // A merge patch's optional members are nullable: ["string", "null"] is not a string but for null.
      const type = [schema.type].flat().find(type => type !== undefined && type !== 'null')
      if (type !== undefined) {
        variations.push(`${op.summary}[${pascal(member)}NotA${/^[aeiou]/.test(type) ? 'n' : ''}${pascal(type)}]`)
      }
    }
    if (method !== 'post') continue
    for (const member of body.required ?? []) variations.push(`${op.summary}[Fuzz][required ${member}]`)
    for (const [member, schema] of members) {
      if ((schema.minLength ?? 0) > 0) variations.push(`${op.summary}[Fuzz][minimum length ${member}]`)
      if (schema.maxLength !== undefined) variations.push(`${op.summary}[Fuzz][maximum length ${member}]`)
    }
  }
  const categoryVariations = [
    'MissingName',
    'NameNotAString',
    'DescriptionNotAString',
    'Fuzz][required name',
    'Fuzz][minimum length name',
    'Fuzz][maximum length name',
    'Fuzz][maximum length description'
  ]
  for (const variation of categoryVariations) {
    t.ok(variations.includes(`Create a category[${variation}]`), `the document asks for ${variation}`)
  }
  for (const variation of variations) {
    const item = all.find(i => i.name === variation)
    t.ok(item, variation)
    if (item !== undefined) t.match(tests(item), /Response status code is 400/, `${variation} expects 400`)
  }
  const longName = all.find(i => i.name === 'Create a category[Fuzz][maximum length name]')?.request?.body?.raw ?? '{}'
  t.equal(
    [...(JSON.parse(longName) as { name: string }).name].length,
    256,
    'the fuzzed name is one longer than maxLength'
  )
})
