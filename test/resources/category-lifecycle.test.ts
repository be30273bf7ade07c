import fc from 'fast-check'
import type { FastifyInstance } from 'fastify'
import pg from 'pg'
import t from 'tap'
import { sha256 } from '../../src/config.js'
import { generateKey, keyPrefix } from '../../src/keys/store.js'
import { DESCRIPTION_PATTERN, NAME_PATTERN } from '../../src/shared/text-rules.js'
import { AUTH, json, metric, testApp, until } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { expectedListBody } from '../helpers/list-body.js'

// Read, update, delete and paging of categories (docs/api.md), on two instances of one database.
const db = await testDatabase(t)
const { app: a } = await testApp(t, db.url)
// A pool: the property test below sends a step's SQL updates at once, each on a connection of its own.
const admin = new pg.Pool({ connectionString: db.url })
t.teardown(async () => {
  await admin.end()
})
// A managed read key, written as `npm run keys` writes it, before the second instance reads its keys.
const readKey = generateKey()
await admin.query("INSERT INTO api_keys (name, scope, prefix, digest) VALUES ('reader', 'read', $1, $2)", [
  keyPrefix(readKey),
  sha256(readKey)
])
const READ_KEY_HEADERS = { authorization: `Bearer ${readKey}` }
const { app: b } = await testApp(t, db.url)
await until(
  'both instances listen',
  async () => (await metric(a, 'change_feed_listening')) === 1 && (await metric(b, 'change_feed_listening')) === 1
)

interface Category {
  id: number
  name: string
  description?: string
}
type Response = Awaited<ReturnType<FastifyInstance['inject']>>
interface Request {
  method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE'
  url: string
  headers?: Record<string, string>
  payload?: string
}

async function send (app: FastifyInstance, options: Request): Promise<Response> {
  return await app.inject({ ...options, headers: { ...AUTH, ...options.headers } })
}

async function create (app: FastifyInstance, body: object): Promise<{ row: Category; etag: string }> {
  const res = await app.inject({ method: 'POST', url: '/v1/categories', ...json(body) })
  if (res.statusCode !== 201) throw new Error(`create answered ${res.statusCode}: ${res.body}`)
  const row = res.json() as Category
  return { row, etag: await tagOf(app, row.id) }
}

async function tagOf (app: FastifyInstance, id: number): Promise<string> {
  const res = await send(app, { method: 'GET', url: `/v1/categories/${id}` })
  if (res.statusCode !== 200) throw new Error(`get answered ${res.statusCode}`)
  return res.headers.etag as string
}

const patch = async (
  app: FastifyInstance,
  id: number | string,
  body: unknown,
  headers: Record<string, string> = {}
): Promise<Response> =>
  await send(app, {
    method: 'PATCH',
    url: `/v1/categories/${id}`,
    headers: { 'content-type': 'application/merge-patch+json', ...headers },
    payload: typeof body === 'string' ? body : JSON.stringify(body)
  })

const list = async (app: FastifyInstance): Promise<Category[]> =>
  (await send(app, { method: 'GET', url: '/v1/categories' })).json()

const expectedBody = async (): Promise<string> => await expectedListBody(admin)

const stored = async (id: number): Promise<unknown> =>
  (await admin.query('SELECT id::int, name, description FROM categories WHERE id = $1', [id])).rows[0]
const reads = async (app: FastifyInstance, source: string): Promise<number> =>
  await metric(app, 'categories_list_reads_total', { source })

t.test('GET by id answers a strong ETag; If-None-Match with it is 304, and the tag changes with the row', async t => {
  const { row, etag } = await create(a, { name: 'Dgos' })
  t.match(etag, /^"[^"]+"$/, 'a strong, quoted tag')
  t.equal(await tagOf(b, row.id), etag, 'the same tag on every instance')
  for (const header of [etag, `"x", ${etag}`, '*']) {
    const res = await send(a, { method: 'GET', url: `/v1/categories/${row.id}`, headers: { 'if-none-match': header } })
    t.equal(res.statusCode, 304, header)
    t.equal(res.body, '')
    t.equal(res.headers.etag, etag)
  }
  const updated = await patch(a, row.id, { name: 'Dogs' })
  t.not(updated.headers.etag, etag, 'an update gives a new tag')
  const res = await send(a, { method: 'GET', url: `/v1/categories/${row.id}`, headers: { 'if-none-match': etag } })
  t.equal(res.statusCode, 200, 'the old tag no longer matches')
  t.same(res.json(), { id: row.id, name: 'Dogs' })
  t.equal(res.headers.etag, updated.headers.etag, 'GET and the PATCH that made it agree')
})

t.test(
  'PATCH is a JSON merge patch: members sent replace, members absent stay, null removes the description',
  async t => {
    const { row } = await create(a, { name: 'Cats', description: 'Independent' })
    const renamed = await patch(a, row.id, { name: 'House cats' })
    t.equal(renamed.statusCode, 200)
    t.same(renamed.json(), { id: row.id, name: 'House cats', description: 'Independent' }, 'the whole category')
    t.match(renamed.headers['content-type'], /^application\/json; charset=utf-8$/)
    t.match(renamed.headers.etag, /^"[^"]+"$/)
    const described = await patch(a, row.id, { description: 'Purring' })
    t.same(described.json(), { id: row.id, name: 'House cats', description: 'Purring' })
    const removed = await patch(a, row.id, { description: null })
    t.same(removed.json(), { id: row.id, name: 'House cats' }, 'null removed the description')
    t.same(await stored(row.id), { id: row.id, name: 'House cats', description: null })
    const nothing = await patch(a, row.id, {})
    t.equal(nothing.statusCode, 200, 'an empty patch changes nothing')
    t.same(nothing.json(), { id: row.id, name: 'House cats' })
    t.equal(nothing.headers.etag, removed.headers.etag, 'and keeps the tag')
    const asJson = await send(a, {
      method: 'PATCH',
      url: `/v1/categories/${row.id}`,
      ...json({ name: 'Cats again', description: '' })
    })
    t.equal(asJson.statusCode, 200, 'application/json is read the same way')
    t.same(asJson.json(), { id: row.id, name: 'Cats again', description: '' })
    const withCharset = await patch(
      a,
      row.id,
      { name: 'Cats' },
      { 'content-type': 'application/merge-patch+json; charset=utf-8' }
    )
    t.equal(withCharset.statusCode, 200, 'with a charset=utf-8 parameter too')
  }
)

t.test('a PATCH that breaks a rule is a 400 in the Error shape, and nothing changes', async t => {
  const { row, etag } = await create(a, { name: 'Birds', description: 'Singing' })
  const cases: Array<[string, unknown, string, string]> = [
    ['name: null', { name: null }, 'VALIDATION_FAILED', "'name' must be of type string"],
    ['an unknown member', { nmae: 'x' }, 'VALIDATION_FAILED', "request body has an unknown member 'nmae'"],
    ['id', { id: 99 }, 'VALIDATION_FAILED', "request body has an unknown member 'id'"],
    ['an array', [], 'VALIDATION_FAILED', 'request body must be a JSON object'],
    ['a string', '"text"', 'VALIDATION_FAILED', 'request body must be a JSON object'],
    ['null', 'null', 'VALIDATION_FAILED', 'request body must be a JSON object'],
    ['an empty name', { name: '' }, 'VALIDATION_FAILED', "'name' must be at least 1 character long"],
    ['a long name', { name: 'x'.repeat(256) }, 'VALIDATION_FAILED', "'name' must be at most 255 characters long"],
    ['a blank name', { name: '   ' }, 'VALIDATION_FAILED', "'name' "],
    ['a control character', { name: 'a\u0007b' }, 'VALIDATION_FAILED', "'name' "],
    [
      'a number for the description',
      { description: 5 },
      'VALIDATION_FAILED',
      "'description' must be of type string or null"
    ],
    ['a repeated member', '{"name":"a","name":"b"}', 'VALIDATION_FAILED', 'name'],
    ['not JSON', '{"name":', 'MALFORMED_JSON', 'request body is not valid JSON'],
    ['an empty body', '', 'MALFORMED_JSON', 'request body is empty']
  ]
  for (const [label, body, code, message] of cases) {
    const res = await patch(a, row.id, body)
    t.equal(res.statusCode, 400, label)
    t.same(Object.keys(res.json()).sort(), ['code', 'message', 'status'], `${label}: the Error shape`)
    t.match(res.json(), { code, status: 400 }, label)
    t.ok((res.json().message as string).includes(message), `${label}: ${res.json().message as string}`)
  }
  const noBody = await send(a, { method: 'PATCH', url: `/v1/categories/${row.id}` })
  t.equal(noBody.statusCode, 400, 'a missing body')
  t.equal(noBody.json().message, 'request body must be a JSON object')
  t.same(await stored(row.id), { id: row.id, name: 'Birds', description: 'Singing' }, 'nothing changed')
  t.equal(await tagOf(a, row.id), etag, 'not even the tag')
})

t.test('PATCH takes merge-patch+json or JSON only (415)', async t => {
  const { row } = await create(a, { name: 'Fish' })
  const res = await send(a, {
    method: 'PATCH',
    url: `/v1/categories/${row.id}`,
    headers: { 'content-type': 'text/plain' },
    payload: 'x'
  })
  t.equal(res.statusCode, 415)
  t.same(res.json(), {
    code: 'UNSUPPORTED_MEDIA_TYPE',
    message: 'Content-Type must be application/merge-patch+json or application/json',
    status: 415
  })
})

t.test('If-Match: the current tag (or *) writes, any other is a 412 and nothing changes', async t => {
  const { row, etag } = await create(a, { name: 'Horses' })
  const other = await create(a, { name: 'Ponies' })
  for (const stale of ['"nonsense"', `W/${etag}`, other.etag, '']) {
    const res = await patch(a, row.id, { name: 'Changed' }, { 'if-match': stale })
    t.equal(res.statusCode, 412, `If-Match: ${stale}`)
    t.same(res.json(), {
      code: 'PRECONDITION_FAILED',
      message: `category ${row.id} has changed since it was read: If-Match does not name its current ETag`,
      status: 412
    })
    const deleted = await send(a, { method: 'DELETE', url: `/v1/categories/${row.id}`, headers: { 'if-match': stale } })
    t.equal(deleted.statusCode, 412, `DELETE, If-Match: ${stale}`)
  }
  t.same(await stored(row.id), { id: row.id, name: 'Horses', description: null }, 'nothing changed')
  const current = await patch(a, row.id, { name: 'Horses and mules' }, { 'if-match': `"stale", ${etag}` })
  t.equal(current.statusCode, 200, 'a list that names the current tag')
  const again = await patch(a, row.id, { name: 'Mules' }, { 'if-match': etag })
  t.equal(again.statusCode, 412, 'the tag it replaced is stale now')
  const any = await patch(a, row.id, { name: 'Mules' }, { 'if-match': '*' })
  t.equal(any.statusCode, 200, '* matches any version')
  const removed = await send(a, {
    method: 'DELETE',
    url: `/v1/categories/${row.id}`,
    headers: { 'if-match': any.headers.etag as string }
  })
  t.equal(removed.statusCode, 204, 'DELETE with the current tag')
})

t.test('two PATCHes with the same If-Match at once, on two instances: exactly one 200 and one 412', async t => {
  for (let round = 0; round < 10; round++) {
    const { row, etag } = await create(a, { name: `race ${round}` })
    const answers = await Promise.all(
      [a, b].map(async (app, i) => await patch(app, row.id, { name: `won by ${i}` }, { 'if-match': etag }))
    )
    t.same(answers.map(res => res.statusCode).sort(), [200, 412], `round ${round}`)
    const winner = answers.find(res => res.statusCode === 200)
    t.equal(((await stored(row.id)) as Category).name, winner?.json().name, "the winner's write is stored")
  }
})

t.test('DELETE answers 204 with no body; the id is gone and never used again', async t => {
  const { row } = await create(a, { name: 'Reptiles' })
  const res = await send(a, { method: 'DELETE', url: `/v1/categories/${row.id}` })
  t.equal(res.statusCode, 204)
  t.equal(res.body, '')
  t.notOk(res.headers['content-type'], 'no content type')
  t.equal((await send(b, { method: 'GET', url: `/v1/categories/${row.id}` })).statusCode, 404)
  const twice = await send(a, { method: 'DELETE', url: `/v1/categories/${row.id}` })
  t.same(twice.json(), { code: 'NOT_FOUND', message: `no category with id ${row.id}`, status: 404 })
  const next = await create(a, { name: 'After the delete' })
  t.ok(next.row.id > row.id, 'a later create gets a higher id')
  // Clients that send a JSON Content-Type with every request send it with an empty DELETE too.
  for (const contentType of ['application/json', 'text/plain']) {
    const { row: other } = await create(a, { name: 'Deleted with a content type' })
    const typed = await send(a, {
      method: 'DELETE',
      url: `/v1/categories/${other.id}`,
      headers: { 'content-type': contentType }
    })
    t.equal(typed.statusCode, 204, `an empty body with Content-Type: ${contentType}`)
  }
  const { row: withBody } = await create(a, { name: 'Deleted with a body' })
  const refused = await send(a, { method: 'DELETE', url: `/v1/categories/${withBody.id}`, ...json({ name: 'x' }) })
  t.same(refused.json(), { code: 'UNSUPPORTED_MEDIA_TYPE', message: 'a DELETE takes no body', status: 415 })
  t.equal((await send(a, { method: 'GET', url: `/v1/categories/${withBody.id}` })).statusCode, 200, 'not deleted')
})

t.test('a missing id is 404 and a malformed one 400, for PATCH and DELETE alike', async t => {
  for (const method of ['PATCH', 'DELETE'] as const) {
    const options = method === 'PATCH' ? { headers: { 'content-type': 'application/json' }, payload: '{}' } : {}
    const missing = await send(a, { method, url: '/v1/categories/9223372036854775807', ...options })
    t.same(missing.json(), { code: 'NOT_FOUND', message: 'no category with id 9223372036854775807', status: 404 })
    for (const id of ['0', '-1', '01', '1e3', 'abc', '9223372036854775808']) {
      const res = await send(a, { method, url: `/v1/categories/${id}`, ...options })
      t.same(
        res.json(),
        {
          code: 'VALIDATION_FAILED',
          message: "'id' must be a decimal integer from 1 to 9223372036854775807",
          status: 400
        },
        `${method} ${id}`
      )
    }
  }
})

t.test('a read key gets 403 for PATCH and DELETE, no key 401; other methods 405 with Allow', async t => {
  const { row } = await create(a, { name: 'Guarded' })
  t.equal((await b.inject({ method: 'GET', url: '/v1/categories', headers: READ_KEY_HEADERS })).statusCode, 200)
  for (const method of ['PATCH', 'DELETE'] as const) {
    const refused = await b.inject({
      method,
      url: `/v1/categories/${row.id}`,
      headers: { ...READ_KEY_HEADERS, 'content-type': 'application/json' },
      payload: '{"name":"x"}'
    })
    t.equal(refused.statusCode, 403, `${method} with a read key`)
    t.equal(refused.json().code, 'FORBIDDEN')
    const anonymous = await a.inject({ method, url: `/v1/categories/${row.id}` })
    t.equal(anonymous.statusCode, 401, `${method} without a key`)
  }
  t.same(await stored(row.id), { id: row.id, name: 'Guarded', description: null }, 'nothing changed')
  for (const method of ['PUT', 'POST'] as const) {
    const res = await send(a, { method, url: `/v1/categories/${row.id}`, ...json({ name: 'x' }) })
    t.equal(res.statusCode, 405, method)
    const allowed = (res.headers.allow as string).split(', ')
    t.ok(
      ['GET', 'PATCH', 'DELETE'].every(m => allowed.includes(m)),
      `Allow: ${res.headers.allow as string}`
    )
  }
})

t.test(
  'the instance that answered lists an update or delete in its next answer, the other within a second, ' +
    'with no rebuild',
  async t => {
    await list(a)
    await list(b)
    const refreshes = { a: await reads(a, 'refresh'), b: await reads(b, 'refresh') }
    for (let i = 0; i < 5; i++) {
      const [writer, other] = i % 2 === 0 ? [a, b] : [b, a]
      const { row } = await create(writer, { name: `followed ${i}` })
      await patch(writer, row.id, { name: `followed ${i}, renamed`, description: 'new' })
      t.same(
        (await list(writer)).find(c => c.id === row.id),
        { id: row.id, name: `followed ${i}, renamed`, description: 'new' },
        'the answering instance lists the update at once'
      )
      await until(
        'the other instance lists the update',
        async () => (await list(other)).some(c => c.id === row.id && c.name === `followed ${i}, renamed`),
        1000
      )
      await send(writer, { method: 'DELETE', url: `/v1/categories/${row.id}` })
      t.notOk(
        (await list(writer)).some(c => c.id === row.id),
        'the answering instance lists the delete at once'
      )
      await until(
        'the other instance lists the delete',
        async () => !(await list(other)).some(c => c.id === row.id),
        1000
      )
    }
    const expected = await expectedBody()
    for (const app of [a, b]) t.equal((await send(app, { method: 'GET', url: '/v1/categories' })).body, expected)
    const { row } = await create(a, { name: 'tagged' })
    await until('B lists it', async () => (await list(b)).some(c => c.id === row.id), 1000)
    const tagBefore = (await send(b, { method: 'GET', url: '/v1/categories' })).headers.etag
    await patch(a, row.id, { name: 'tagged, renamed' })
    await until('B lists the rename', async () => (await list(b)).some(c => c.name === 'tagged, renamed'), 1000)
    t.not((await send(b, { method: 'GET', url: '/v1/categories' })).headers.etag, tagBefore, "the list's tag changed")
    t.same({ a: await reads(a, 'refresh'), b: await reads(b, 'refresh') }, refreshes, 'neither rebuilt its list')
    t.ok((await metric(b, 'categories_list_rows_changed_total', { change: 'replaced' })) > 0, 'rows were replaced')
    const echoes = await metric(a, 'categories_list_own_echoes_total')
    const { row: own } = await create(a, { name: 'own echo' })
    await until(
      'A heard the echo of its create',
      async () => (await metric(a, 'categories_list_own_echoes_total')) > echoes
    )
    await patch(a, own.id, { name: 'own echo, renamed' })
    await until(
      'A knew the echo of its update by its version, and read nothing again',
      async () => (await metric(a, 'categories_list_own_echoes_total')) > echoes + 1
    )
    t.ok((await metric(b, 'categories_list_rows_changed_total', { change: 'removed' })) > 0, 'and removed')
  }
)

t.test('updates and deletes made in SQL are followed too, an id changed by an update included', async t => {
  const { row } = await create(a, { name: 'by SQL' })
  await list(b)
  await admin.query("UPDATE categories SET name = 'by SQL, renamed' WHERE id = $1", [row.id])
  await until('B lists the rename', async () => (await list(b)).some(c => c.name === 'by SQL, renamed'), 1000)
  const moved = row.id + 1_000_000
  await admin.query('UPDATE categories SET id = $2 WHERE id = $1', [row.id, moved])
  await until(
    'B lists the new id, not the old',
    async () => {
      const ids = (await list(b)).map(c => c.id)
      return ids.includes(moved) && !ids.includes(row.id)
    },
    1000
  )
  await admin.query('DELETE FROM categories WHERE id = $1', [moved])
  await until('B no longer lists it', async () => !(await list(b)).some(c => c.id === moved), 1000)
  // Both instances, each within the second, and A by its whole list: A may not have heard the rename or the new id
  // yet, so that it does not list the deleted id proves nothing. The next test reads A's list beside B's pages.
  const expected = await expectedBody()
  for (const [name, app] of [['A', a], ['B', b]] as const) {
    const body = async (): Promise<string> => (await send(app, { method: 'GET', url: '/v1/categories' })).body
    await until(`${name} lists the table as it is`, async () => (await body()) === expected, 1000)
    t.equal(await body(), expected, name)
  }
})

t.test('paging: limit alone starts at the first row; a Link to the next page while rows follow', async t => {
  const all = await list(a)
  t.ok(all.length >= 5, `${all.length} rows`)
  const first = await send(a, { method: 'GET', url: '/v1/categories?limit=2' })
  t.equal(first.statusCode, 200)
  t.same(first.json(), all.slice(0, 2))
  t.equal(first.headers.link, `</v1/categories?limit=2&after=${all[1]?.id}>; rel="next"`)
  t.equal(first.headers['cache-control'], 'no-cache')
  t.match(first.headers['content-type'], /^application\/json; charset=utf-8$/)
  const pages: Category[] = []
  let url: string | undefined = '/v1/categories?limit=2'
  while (url !== undefined) {
    const res = await send(b, { method: 'GET', url })
    t.equal(res.statusCode, 200, url)
    const page = res.json() as Category[]
    t.ok(page.length <= 2)
    pages.push(...page)
    url = (res.headers.link as string | undefined)?.match(/^<([^>]+)>; rel="next"$/)?.[1]
  }
  t.same(pages, all, 'the pages together are the list')
  const last = all.at(-1) as Category
  const end = await send(a, { method: 'GET', url: `/v1/categories?limit=${all.length}` })
  t.same(end.json(), all, 'a page that holds the rest')
  t.notOk(end.headers.link, 'has no next page')
  const empty = await send(a, { method: 'GET', url: `/v1/categories?limit=5&after=${last.id}` })
  t.equal(empty.body, '[]', 'after the last id: an empty page')
  t.notOk(empty.headers.link, 'with no next page')
  const middle = await send(a, { method: 'GET', url: `/v1/categories?after=${all[1]?.id}&limit=1` })
  t.same(middle.json(), [all[2]], 'after an id: the rows with greater ids')
  const between = await send(a, { method: 'GET', url: `/v1/categories?limit=1&after=${(all[1]?.id ?? 0) + 0}` })
  t.same(between.json(), [all[2]])
  t.equal(
    (await send(a, { method: 'GET', url: '/v1/categories?unknown=1' })).body,
    (await send(a, { method: 'GET', url: '/v1/categories' })).body,
    'another parameter changes nothing (as in 1.0)'
  )
})

t.test('paging: any other limit or after is a 400 naming it', async t => {
  const limitMessage = "'limit' must be a decimal integer from 1 to 10000"
  const afterMessage = "'after' must be a decimal integer from 1 to 9223372036854775807"
  const cases: Array<[string, string]> = [
    ['limit=0', limitMessage],
    ['limit=10001', limitMessage],
    ['limit=-1', limitMessage],
    ['limit=1.5', limitMessage],
    ['limit=01', limitMessage],
    ['limit=abc', limitMessage],
    ['limit=', limitMessage],
    ['limit=1&limit=2', limitMessage],
    ['limit=1e2', limitMessage],
    ['limit=10&after=0', afterMessage],
    ['limit=10&after=-5', afterMessage],
    ['limit=10&after=x', afterMessage],
    ['limit=10&after=9223372036854775808', afterMessage],
    ['limit=10&after=1&after=2', afterMessage],
    ['after=5', "'after' is used with 'limit': send both, or neither"]
  ]
  for (const [query, message] of cases) {
    const res = await send(a, { method: 'GET', url: `/v1/categories?${query}` })
    t.equal(res.statusCode, 400, query)
    t.same(res.json(), { code: 'VALIDATION_FAILED', message, status: 400 }, query)
  }
  const most = await send(a, { method: 'GET', url: '/v1/categories?limit=10000&after=9223372036854775807' })
  t.equal(most.statusCode, 200, 'the bounds themselves are valid')
})

t.test('paging through a list while rows are created and deleted: no row twice, none skipped that stayed', async t => {
  await admin.query("INSERT INTO categories (name) SELECT 'paged ' || i FROM generate_series(1, 300) AS i")
  await until('both instances list them', async () =>
    (await Promise.all([a, b].map(list))).every(rows => rows.filter(c => c.name.startsWith('paged ')).length === 300)
  )
  const before = (await list(a)).filter(c => c.name.startsWith('paged '))
  const doomed = new Set(before.filter((_, i) => i % 7 === 3).map(c => c.id))
  const seen: number[] = []
  let url: string | undefined = '/v1/categories?limit=25'
  for (let page = 0; url !== undefined; page++) {
    // Between pages: a create, a delete of a row not yet read or already read, served by either instance.
    await create(page % 2 === 0 ? a : b, { name: `created while paging ${page}` })
    const victim = [...doomed][page]
    if (victim !== undefined) await send(page % 2 === 0 ? b : a, { method: 'DELETE', url: `/v1/categories/${victim}` })
    const res = await send(page % 2 === 0 ? a : b, { method: 'GET', url })
    seen.push(...(res.json() as Category[]).map(c => c.id))
    url = (res.headers.link as string | undefined)?.match(/^<([^>]+)>/)?.[1]
  }
  t.equal(new Set(seen).size, seen.length, 'no row twice')
  t.same(
    seen,
    [...seen].sort((x, y) => x - y),
    'in id order'
  )
  const stayed = before.filter(c => !doomed.has(c.id)).map(c => c.id)
  t.same(
    stayed.filter(id => !seen.includes(id)),
    [],
    'every row that existed throughout was read'
  )
})

t.test('a page comes from the cached list: no rebuild, the same bytes as the list', async t => {
  await list(a)
  const refreshes = await reads(a, 'refresh')
  const cached = await reads(a, 'cache')
  const whole = await list(a)
  const page = await send(a, { method: 'GET', url: `/v1/categories?limit=7&after=${whole[3]?.id}` })
  t.same(page.json(), whole.slice(4, 11))
  t.equal(await reads(a, 'refresh'), refreshes, 'no rebuild')
  t.ok((await reads(a, 'cache')) > cached, 'read from the cache')
})

t.test(
  'any sequence of creates, updates and deletes on two instances, some at once, leaves both lists byte for ' +
    "byte the table's, with no rebuild",
  async t => {
    const seed =
      process.env.FC_SEED !== undefined && process.env.FC_SEED !== ''
        ? Number(process.env.FC_SEED)
        : Date.now() % 2 ** 31
    t.comment(`fast-check seed ${seed}`)
    const operation = fc.record({
      on: fc.constantFrom(a, b),
      kind: fc.constantFrom('create', 'update', 'delete', 'sql update'),
      pick: fc.nat(),
      name: fc.string({ minLength: 1, maxLength: 10 }).filter(name => new RegExp(NAME_PATTERN).test(name)),
      description: fc.option(fc.string({ maxLength: 10 }).filter(text => new RegExp(DESCRIPTION_PATTERN).test(text)))
    })
    const refreshes = { a: await reads(a, 'refresh'), b: await reads(b, 'refresh') }
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.array(operation, { minLength: 1, maxLength: 4 }), { minLength: 1, maxLength: 6 }),
        async steps => {
          for (const step of steps) {
            const ids = (await admin.query<{ id: number }>('SELECT id::int FROM categories ORDER BY id')).rows.map(
              row => row.id
            )
            // The operations of a step go at once: the instances' caches see them in any order.
            await Promise.all(
              step.map(async ({ on, kind, pick, name, description }) => {
                const id = ids[pick % Math.max(1, ids.length)] ?? 1
                if (kind === 'create') await create(on, description === null ? { name } : { name, description })
                else if (kind === 'update') await patch(on, id, { name, description })
                else if (kind === 'delete') await send(on, { method: 'DELETE', url: `/v1/categories/${id}` })
                else await admin.query('UPDATE categories SET name = $2 WHERE id = $1', [id, name])
              })
            )
          }
          const expected = await expectedBody()
          for (const app of [a, b]) {
            await until(
              "the instance's list is the table's",
              async () => (await send(app, { method: 'GET', url: '/v1/categories' })).body === expected,
              1000
            )
          }
        }
      ),
      { seed, numRuns: 25 }
    )
    t.same({ a: await reads(a, 'refresh'), b: await reads(b, 'refresh') }, refreshes, 'neither rebuilt its list')
  }
)
