import t from 'tap'
import { testApp } from './helpers/app.js'
import { testDatabase } from './helpers/database.js'

const db = await testDatabase(t)
const { app } = await testApp(t, db.url)

const res = await app.inject({ method: 'GET', url: '/docs/openapi.json' })
const doc = res.json()
type Operation = { operationId?: string, security?: unknown, deprecated?: boolean, description?: string, responses: Record<string, any>, 'x-stability'?: string }
const operations: Array<[string, string, Operation]> = Object.entries(doc.paths as Record<string, Record<string, Operation>>)
  .flatMap(([path, item]) => Object.entries(item).map(([method, op]) => [path, method, op] as [string, string, Operation]))

t.equal(res.statusCode, 200)
t.equal(doc.openapi, '3.1.0')
t.equal(doc.info.version, '1.0.0')

t.test('servers are {base_url} entries for production and staging ending in /v1; paths are relative to them', async t => {
  t.same(doc.servers.map((s: { description: string }) => s.description), ['Production', 'Staging'])
  for (const server of doc.servers) {
    t.match(server.url, /^\{base_url\}\/v1$/)
    t.type(server.variables.base_url.default, 'string')
  }
  t.same(Object.keys(doc.paths).sort(), ['/categories', '/categories/{id}', '/pets/{petId}', '/store/orders'])
})

t.test('bearer security on every operation', async t => {
  t.same(doc.components.securitySchemes.bearer, { type: 'http', scheme: 'bearer', description: doc.components.securitySchemes.bearer.description })
  t.same(doc.security, [{ bearer: [] }])
  for (const [path, method, op] of operations) t.same(op.security, [{ bearer: [] }], `${method} ${path}`)
})

t.test('operation ids, stability and deprecation', async t => {
  const ids = Object.fromEntries(operations.map(([path, method, op]) => [`${method} ${path}`, op.operationId]))
  t.equal(ids['get /categories'], 'listCategories')
  t.equal(ids['post /categories'], 'createCategory')
  t.equal(ids['get /categories/{id}'], 'getCategory')
  t.equal(doc.paths['/categories/{id}'].get['x-stability'], 'experimental')
  for (const [, , op] of operations) {
    if (op['x-stability'] !== undefined) t.match(op['x-stability'], /^(experimental|beta)$/)
  }
  t.equal(doc.paths['/pets/{petId}'].get.deprecated, true)
  t.notOk(doc.paths['/categories'].get.deprecated)
  for (const path of ['/pets/{petId}', '/store/orders']) {
    t.match(doc.paths[path].get.description, /not defined yet/, `${path} says its behaviour is not defined yet`)
    t.ok(doc.paths[path].get.responses['501'], `${path} documents 501`)
  }
})

t.test('every documented error status uses the Error schema; schemas come from the same TypeBox values', async t => {
  for (const [path, method, op] of operations) {
    for (const [status, response] of Object.entries(op.responses)) {
      if (Number(status) >= 400) {
        t.same(response.content['application/json'].schema, { $ref: '#/components/schemas/Error' }, `${method} ${path} ${status}`)
        t.not(response.description, 'Default Response', `${method} ${path} ${status} has a description`)
      }
    }
    t.ok(op.responses['401'], `${method} ${path} documents 401`)
  }
  t.same(doc.components.schemas.Error.required, ['code', 'message', 'status'])
  t.equal(doc.components.schemas.Error.additionalProperties, false)
  t.equal(doc.components.schemas.NewCategory.additionalProperties, false)
  t.same(doc.components.schemas.Category.properties.id, { ...doc.components.schemas.Category.properties.id, type: 'integer', format: 'int64' })
  t.same(doc.paths['/categories'].post.requestBody.content['application/json'].schema, { $ref: '#/components/schemas/NewCategory' })
})

t.test('operational routes are not in the document, and the reference page is served', async t => {
  t.notOk(JSON.stringify(doc.paths).includes('/health'))
  const page = await app.inject({ method: 'GET', url: '/docs/' })
  t.equal(page.statusCode, 200)
  t.match(page.headers['content-type'], /text\/html/)
})
