import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import t from 'tap'
import { generateCollection } from '../scripts/generate-postman.js'
import { testApp } from './helpers/app.js'
import { testDatabase } from './helpers/database.js'

/*
 * The Postman collection served beside the document is the one Portman makes from the
 * document served now (`npm run postman:generate` after a schema change), and it holds
 * the tests users are told it holds. `npm run test:postman` runs it against a live instance.
 */

const db = await testDatabase(t)
const { app } = await testApp(t, db.url)

const served = await app.inject({ method: 'GET', url: '/docs/petstore.postman_collection.json' })

interface Item { name: string, item?: Item[], request?: { method: string, body?: { raw?: string } }, event?: Array<{ listen: string, script: { exec: string[] } }> }
const collection = served.json() as { info: { name: string }, auth: { type: string }, variable: Array<{ key: string, value: string }>, item: Item[] }
const requests = (items: Item[]): Item[] => items.flatMap(item => item.item === undefined ? [item] : requests(item.item))
const all = requests(collection.item)
const tests = (item: Item): string => item.event?.filter(e => e.listen === 'test').flatMap(e => e.script.exec).join('\n') ?? ''

t.test('served like the document: no key needed, JSON, offered as a download', async t => {
  t.equal(served.statusCode, 200)
  t.match(served.headers['content-type'], /^application\/json/)
  t.match(served.headers['content-disposition'], /attachment; filename="petstore\.postman_collection\.json"/)
  t.equal(collection.info.name, 'Petstore API')
  t.equal(collection.auth.type, 'bearer', 'the key is the collection\'s bearer token ({{bearerToken}})')
  t.ok(collection.variable.some(v => v.key === 'baseUrl'), 'the deployment is the baseUrl variable')
})

t.test('it is current: Portman on the document served now gives the same file', async t => {
  const dir = await mkdtemp(path.join(tmpdir(), 'petstore-collection-test-'))
  t.teardown(async () => { await rm(dir, { recursive: true, force: true }) })
  const documentFile = path.join(dir, 'openapi.json')
  await writeFile(documentFile, (await app.inject({ method: 'GET', url: '/docs/openapi.json' })).body)
  const fresh = await generateCollection(documentFile)
  t.ok(fresh === served.body, 'the served collection equals a fresh one; run `npm run postman:generate` and commit src/http/petstore.postman_collection.json')
})

t.test('contract tests on every operation: status, content type, JSON body, schema', async t => {
  const operations = all.filter(item => !/\[/.test(item.name))
  t.same(operations.map(item => item.name).sort(), ['Create a category', 'Get a pet (deprecated placeholder)', 'Get one category (experimental)', 'List every category', 'List store orders (placeholder)'])
  for (const item of operations) {
    const script = tests(item)
    t.match(script, /Status code is 2xx|Response status code is 501/, `${item.name}: status`)
    t.match(script, /Content-Type is application\/json/, `${item.name}: content type`)
    t.match(script, /to\.have\.jsonBody\(\)/, `${item.name}: JSON body`)
    t.match(script, /to\.have\.jsonSchema\(schema/, `${item.name}: schema`)
  }
})

t.test('variations: no key, a wrong key, a missing name, wrong types, and length fuzzing', async t => {
  const names = all.map(item => item.name)
  for (const operation of ['Create a category', 'List every category', 'Get one category (experimental)', 'Get a pet (deprecated placeholder)', 'List store orders (placeholder)']) {
    t.ok(names.includes(`${operation}[NoKey]`), `${operation} without a key`)
    t.ok(names.includes(`${operation}[WrongKey]`), `${operation} with a wrong key`)
  }
  for (const variation of ['MissingName', 'NameNotAString', 'DescriptionNotAString', 'Fuzz][required name', 'Fuzz][minimum length name', 'Fuzz][maximum length name', 'Fuzz][maximum length description']) {
    const item = all.find(i => i.name === `Create a category[${variation}]`)
    t.ok(item, variation)
    if (item !== undefined) t.match(tests(item), /Response status code is 400/, `${variation} expects 400`)
  }
  const longName = all.find(i => i.name === 'Create a category[Fuzz][maximum length name]')?.request?.body?.raw ?? '{}'
  t.equal([...(JSON.parse(longName) as { name: string }).name].length, 256, 'the fuzzed name is one longer than maxLength')
})
