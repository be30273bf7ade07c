import { readFileSync } from 'node:fs'
import t from 'tap'
import { compareDocuments } from '../../scripts/api-compatibility.js'
import { ARTIFACTS, DOCUMENT, check as checkFiles } from '../../scripts/published-interface.js'
import { testApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

const db = await testDatabase(t)
const { app } = await testApp(t, db.url)

t.test('the committed openapi.json is the document the service serves, byte for byte', async t => {
  const served = await app.inject({ method: 'GET', url: '/docs/openapi.json' })
  t.equal(served.statusCode, 200)
  t.equal(readFileSync(DOCUMENT, 'utf8'), served.body, 'run npm run api:generate and commit openapi.json')
})

t.test(
  'npm run api:check on this tree: every generated file current, nothing broken against the committed document',
  async t => {
    const { errors, notes } = await checkFiles({ base: DOCUMENT })
    t.ok(
      Object.keys(ARTIFACTS).includes('clients/typescript/src/generated/openapi.ts'),
      "the client's types are generated"
    )
    t.ok(Object.keys(ARTIFACTS).includes('src/http/petstore.postman_collection.json'), 'and the Postman collection')
    for (const file of Object.keys(ARTIFACTS)) {
      t.notOk(
        errors.some(error => error.includes(file)),
        `${file} is current (npm run api:generate)`
      )
    }
    t.same(errors, [])
    t.same(notes, [`compared with ${DOCUMENT}: 0 breaking, 0 allowed`])
  }
)

/** What `npm run api:check -- --base base.json --document <fixture>.json` finds: its exit code and output. */
async function check (fixture: string): Promise<{ code: number; output: string }> {
  const dir = 'test/fixtures/api-check'
  const { errors, notes } = await checkFiles({ base: `${dir}/base.json`, document: `${dir}/${fixture}.json` })
  return { code: errors.length > 0 ? 1 : 0, output: [...notes, ...errors].join('\n') }
}

t.test(
  'the gate: a removed response field of a stable operation fails, naming the operation and the field',
  async t => {
    const { code, output } = await check('removed-response-field')
    t.equal(code, 1)
    t.match(
      output,
      new RegExp('error: breaking change .*listCategories \\(GET /categories\\): ' +
        '\\[Removed\\] member `description` of the 200 response body')
    )
    t.match(
      output,
      new RegExp('error: breaking change .*createCategory \\(POST /categories\\): ' +
        '\\[Removed\\] member `description` of the 201 response body')
    )
    t.match(output, /warning: getCategory .*experimental/, 'the experimental operation is only warned about')
  }
)

t.test('the gate: an added optional response field passes without a word', async t => {
  const { code, output } = await check('added-optional-field')
  t.equal(code, 0)
  t.notMatch(output, /error|warning/)
  t.match(output, /0 breaking, 0 allowed/)
})

t.test('the gate: a breaking change to the experimental getCategory passes with a warning', async t => {
  const { code, output } = await check('experimental-breaking')
  t.equal(code, 0)
  t.match(
    output,
    new RegExp('warning: getCategory \\(GET /categories/\\{id\\}\\): ' +
      '\\[Replaced\\] type definition in path parameter `id`.*x-stability: experimental')
  )
})

t.test('the gate: a removed operation and a new required request field fail', async t => {
  const removed = await check('removed-operation')
  t.equal(removed.code, 1)
  t.match(removed.output, /createCategory \(POST \/categories\): \[Removed\] operation POST \/categories/)
  const required = await check('new-required-request-field')
  t.equal(required.code, 1)
  t.match(required.output, /createCategory \(POST \/categories\): \[Added\] required status to `color` in Request Body/)
})

t.test('the gate: breaking changes are allowed when the version in the path changes', async t => {
  const { code, output } = await check('new-path-version')
  t.equal(code, 0)
  t.match(output, /warning: createCategory .*Removed\] operation.*path version changes from \/v1 to \/v2/)
})

t.test('compareDocuments: the same document has no changes; a removed path names each of its operations', async t => {
  const base = JSON.parse(readFileSync('test/fixtures/api-check/base.json', 'utf8'))
  t.same(compareDocuments(base, base), { breaking: [], warnings: [] })
  const after = structuredClone(base)
  delete after.paths['/store/orders']
  delete after.paths['/categories/{id}']
  const { breaking, warnings } = compareDocuments(base, after)
  t.same(breaking, ['listOrders (GET /store/orders): [Removed] operation GET /store/orders'])
  t.same(warnings, [
    'getCategory (GET /categories/{id}): [Removed] operation GET /categories/{id} ' +
      '(allowed: the operation is x-stability: experimental)'
  ])
})
