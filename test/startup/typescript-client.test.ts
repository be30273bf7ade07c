import { execFile } from 'node:child_process'
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { promisify } from 'node:util'
import { randomBytes } from 'node:crypto'
import { createClient as generateHeyApi } from '@hey-api/openapi-ts'
import openapiTS, { astToString } from 'openapi-typescript'
import t from 'tap'
import { createPetstoreClient, type ErrorBody } from '../../clients/typescript/src/index.js'
import { TEST_KEY, listeningApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { withClient } from '../helpers/pg-client.js'
import { untracked } from '../helpers/untracked.js'

/*
 * The TypeScript client against a live service: in the normal id range and with the
 * categories sequence moved past 2^53. And programs a consumer would write, compiled
 * under strict TypeScript against clients generated from the committed openapi.json by
 * openapi-typescript and by @hey-api/openapi-ts, then run against the same service.
 * The README's program, which imports the built package, is run by test/interface/documentation.test.ts.
 */

const run = promisify(execFile)
const db = await testDatabase(t)
const { port } = await listeningApp(t, db.url)
const baseUrl = `http://127.0.0.1:${port}`
const petstore = createPetstoreClient({ baseUrl, apiKey: TEST_KEY })
const ABOVE_2_53 = 9007199254740993n

// Programs live under .cache (ignored by git) so that they resolve the repository's node_modules.
const work = path.resolve('.cache', `typescript-client-${randomBytes(4).toString('hex')}`)
await mkdir(work, { recursive: true })
t.teardown(async () => {
  await rm(work, { recursive: true, force: true })
})

const programEnv = { ...process.env, PETSTORE_URL: baseUrl, PETSTORE_API_KEY: TEST_KEY }
async function runProgram (file: string): Promise<string> {
  const program = untracked(process.execPath, ['--import', 'tsx', file])
  const { stdout } = await run(...program, { env: programEnv, cwd: work })
  return stdout.trim()
}

t.test('normal range: create, get and list round-trip ids as bigints', async t => {
  const created = await petstore.createCategory({ name: 'Dogs', description: 'Loyal' })
  if (created.error !== undefined) throw new Error(created.error.message)
  t.equal(created.response.status, 201)
  t.equal(typeof created.data.id, 'bigint')
  t.equal(created.response.headers.get('location'), `/v1/categories/${created.data.id}`)
  const got = await petstore.getCategory(created.data.id)
  t.same(got.data, { id: created.data.id, name: 'Dogs', description: 'Loyal' })
  const list = await petstore.listCategories()
  t.same(list.data, [{ id: created.data.id, name: 'Dogs', description: 'Loyal' }])
})

t.test('Idempotency-Key and If-None-Match are usable', async t => {
  const key = `client-${randomBytes(4).toString('hex')}`
  const first = await petstore.createCategory({ name: 'Cats' }, { idempotencyKey: key })
  const again = await petstore.createCategory({ name: 'Cats' }, { idempotencyKey: key })
  t.equal(again.response.headers.get('idempotent-replayed'), 'true')
  t.equal(again.data?.id, first.data?.id, 'the retry replays the first answer')
  const reused = await petstore.createCategory({ name: 'Other' }, { idempotencyKey: key })
  t.match(reused.error, { code: 'IDEMPOTENCY_KEY_REUSED', status: 422 })
  const list = await petstore.listCategories()
  const etag = list.response.headers.get('etag')
  t.ok(etag)
  const unchanged = await petstore.listCategories({ ifNoneMatch: etag ?? '' })
  t.equal(unchanged.response.status, 304)
  t.ok('notModified' in unchanged && unchanged.notModified)
})

t.test('update, delete and pages through the client: If-Match, a merge patch, the Link header', async t => {
  const created = await petstore.createCategory({ name: 'Dgos', description: 'typo' })
  if (created.error !== undefined) throw new Error(created.error.message)
  const got = await petstore.getCategory(created.data.id)
  const tag = got.response.headers.get('etag') ?? ''
  const unchanged = await petstore.getCategory(created.data.id, { ifNoneMatch: tag })
  t.ok('notModified' in unchanged && unchanged.notModified, 'a 304 for an unchanged category')
  const fixed = await petstore.updateCategory(created.data.id, { name: 'Dogs', description: null }, { ifMatch: tag })
  t.same(fixed.data, { id: created.data.id, name: 'Dogs' })
  const stale = await petstore.updateCategory(created.data.id, { name: 'Cats' }, { ifMatch: tag })
  t.equal(stale.error?.code, 'PRECONDITION_FAILED')
  const page = await petstore.listCategories({ limit: 1, after: created.data.id - 1n })
  t.same(page.data, [{ id: created.data.id, name: 'Dogs' }])
  const deleted = await petstore.deleteCategory(created.data.id)
  t.equal(deleted.response.status, 204)
  t.equal(deleted.data, null)
  t.equal((await petstore.getCategory(created.data.id)).error?.status, 404)
})

t.test('errors are the typed Error body: 401, 400, the deprecated 501', async t => {
  const stranger = createPetstoreClient({ baseUrl, apiKey: 'not-a-key' })
  const unauthorized = await stranger.listCategories()
  const expected: ErrorBody = { code: 'UNAUTHORIZED', message: unauthorized.error?.message ?? '', status: 401 }
  t.same(unauthorized.error, expected)
  t.equal(unauthorized.response.status, 401)
  const invalid = await petstore.createCategory({ name: '' })
  t.same(invalid.error, { code: 'VALIDATION_FAILED', message: "'name' must be at least 1 character long", status: 400 })
  const badId = await petstore.getCategory(0n)
  t.same(badId.error, {
    code: 'VALIDATION_FAILED',
    message: "'id' must be a decimal integer from 1 to 9223372036854775807",
    status: 400
  })
  const missing = await petstore.getCategory(9223372036854775807n)
  t.same(missing.error, { code: 'NOT_FOUND', message: 'no category with id 9223372036854775807', status: 404 })
  const pet = await petstore.getPet('1')
  t.same(pet.error, { code: 'NOT_IMPLEMENTED', message: 'getPet is not implemented yet', status: 501 })
  t.equal(pet.response.headers.get('deprecation'), 'true')
  const orders = await petstore.listOrders()
  t.equal(orders.error?.code, 'NOT_IMPLEMENTED')
})

t.test("an answer that is not the API's own Error body is thrown, not typed", async t => {
  const proxy = createPetstoreClient({
    baseUrl,
    apiKey: TEST_KEY,
    fetch: async () => new Response('<html>bad gateway</html>', { status: 502 })
  })
  await t.rejects(proxy.listCategories(), /502/)
})

/** Consumer programs: the same program for each generator, each compiled strictly and run. */
const programs = {
  'openapi-typescript.ts': `import createClient from 'openapi-fetch'
import type { paths } from './openapi-typescript/schema.js'
const client = createClient<paths>({
  baseUrl: \`\${process.env.PETSTORE_URL ?? ''}/v1\`,
  headers: { authorization: \`Bearer \${process.env.PETSTORE_API_KEY ?? ''}\` }
})
const created = await client.POST('/categories', { body: { name: 'from openapi-typescript' } })
if (created.data === undefined) throw new Error(created.error.message)
const got = await client.GET('/categories/{id}', { params: { path: { id: created.data.id } } })
if (got.data === undefined) throw new Error(got.error.message)
console.log(JSON.stringify([created.data.id, got.data.id, got.data.name]))
`,
  'hey-api.ts': `import { client } from './hey-api/client.gen.js'
import { createCategory, getCategory } from './hey-api/sdk.gen.js'
client.setConfig({
  baseUrl: \`\${process.env.PETSTORE_URL ?? ''}/v1\`,
  headers: { authorization: \`Bearer \${process.env.PETSTORE_API_KEY ?? ''}\` }
})
const created = await createCategory({ body: { name: 'from hey-api' } })
if (created.data === undefined) throw new Error(String(created.error?.message))
const got = await getCategory({ path: { id: created.data.id } })
if (got.data === undefined) throw new Error(String(got.error?.message))
console.log(JSON.stringify([created.data.id, got.data.id, got.data.name]))
`
}

t.test('consumer programs compile under strict TypeScript with clients from both generators', async t => {
  const document = await readFile('openapi.json', 'utf8')
  await mkdir(path.join(work, 'openapi-typescript'), { recursive: true })
  await writeFile(
    path.join(work, 'openapi-typescript', 'schema.ts'),
    astToString(await openapiTS(JSON.parse(document)))
  )
  await generateHeyApi({
    input: path.resolve('openapi.json'),
    output: path.join(work, 'hey-api'),
    logs: { level: 'silent' },
    plugins: ['@hey-api/client-fetch', '@hey-api/sdk', '@hey-api/typescript']
  })
  for (const [file, source] of Object.entries(programs)) await writeFile(path.join(work, file), source)
  await writeFile(path.join(work, 'package.json'), JSON.stringify({ type: 'module', private: true }))
  await writeFile(
    path.join(work, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: {
        strict: true,
        noEmit: true,
        target: 'ES2022',
        module: 'ESNext',
        moduleResolution: 'Bundler',
        lib: ['ES2023', 'DOM'],
        types: ['node'],
        skipLibCheck: true
      },
      files: ['openapi-typescript.ts', 'hey-api.ts']
    })
  )
  const tsc = path.resolve('node_modules/typescript/bin/tsc')
  const compiled = await run(...untracked(process.execPath, [tsc, '-p', path.join(work, 'tsconfig.json')])).then(
    () => '',
    (error: { stdout: string }) => error.stdout
  )
  t.equal(compiled, '', 'tsc --strict reports nothing')

  for (const file of Object.keys(programs)) {
    const [createdId, gotId, name] = JSON.parse(await runProgram(file)) as [number, number, string]
    t.equal(gotId, createdId, `${file}: the id from create gets the same category`)
    t.match(name, /^from /, file)
  }
})

t.test('past 2^53: the sequence moved, every id comes back exact', async t => {
  await withClient(db.url, async client => {
    await client.query(`SELECT setval('categories_id_seq', ${ABOVE_2_53 - 1n})`)
  })
  const created = await petstore.createCategory({ name: 'Big' })
  t.equal(created.data?.id, ABOVE_2_53)
  t.not(Number(ABOVE_2_53).toString(), ABOVE_2_53.toString(), 'JSON.parse would have answered ...992')
  const got = await petstore.getCategory(ABOVE_2_53)
  t.same(got.data, { id: ABOVE_2_53, name: 'Big' })
  t.equal(
    (await petstore.getCategory(ABOVE_2_53 - 1n)).error?.status,
    404,
    'the neighbour below is not found: nothing rounds'
  )
  const listed = await petstore.listCategories()
  t.ok(listed.data?.some(category => category.id === ABOVE_2_53 && category.name === 'Big'))
  const key = `big-${randomBytes(4).toString('hex')}`
  const first = await petstore.createCategory({ name: 'Bigger' }, { idempotencyKey: key })
  const replay = await petstore.createCategory({ name: 'Bigger' }, { idempotencyKey: key })
  t.equal(first.data?.id, ABOVE_2_53 + 1n)
  t.equal(replay.data?.id, ABOVE_2_53 + 1n, 'a replayed answer is parsed exactly too')
})

t.test("every integer of a successful response is int64, so the client's bigints are the documented type", async t => {
  const doc = JSON.parse(await readFile('openapi.json', 'utf8'))
  const integers: string[] = []
  const visit = (schema: Record<string, unknown>, where: string): void => {
    if (typeof schema.$ref === 'string') {
      visit(doc.components.schemas[schema.$ref.split('/').at(-1) as string], schema.$ref)
      return
    }
    if (schema.type === 'integer') integers.push(`${where}: ${String(schema.format)}`)
    for (const [name, child] of Object.entries((schema.properties ?? {}) as Record<string, Record<string, unknown>>)) {
      visit(child, `${where}.${name}`)
    }
    if (typeof schema.items === 'object' && schema.items !== null) {
      visit(schema.items as Record<string, unknown>, `${where}[]`)
    }
  }
  for (const [p, item] of Object.entries(
    doc.paths as Record<
      string,
      Record<string, { responses: Record<string, { content?: Record<string, { schema: Record<string, unknown> }> }> }>
    >
  )) {
    for (const [method, operation] of Object.entries(item)) {
      for (const [status, response] of Object.entries(operation.responses)) {
        if (status.startsWith('2') && response.content !== undefined) {
          visit(response.content['application/json']?.schema ?? {}, `${method} ${p} ${status}`)
        }
      }
    }
  }
  t.ok(integers.length > 0)
  t.same(
    integers.filter(found => !found.endsWith(': int64')),
    []
  )
})
