import pg from 'pg'
import t from 'tap'
import type { Category, NewCategory } from '../../src/categories/schemas.js'
import { Table } from '../../src/db/table.js'
import { testApp, AUTH, histogram, json, metric } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

const db = await testDatabase(t)
// A short statement timeout, so that a table held locked below fails a batch quickly (as a 503).
const { app } = await testApp(t, db.url, { DB_STATEMENT_TIMEOUT_MS: '500' })

t.test('200 concurrent creates: each gets its own row and id, in fewer INSERTs than rows', async t => {
  const before = await histogram(app, 'categories_insert_batch_rows')
  const sent = Array.from({ length: 200 }, (_, i) =>
    i % 3 === 0 ? { name: `gc-${i}` } : { name: `gc-${i}`, description: `d${i}` }
  )
  const responses = await Promise.all(
    sent.map(async body => await app.inject({ method: 'POST', url: '/v1/categories', ...json(body) }))
  )
  const created = responses.map(res => {
    t.equal(res.statusCode, 201)
    return res.json() as { id: number; name: string; description?: string }
  })
  t.same(
    created.map(c => ({ name: c.name, description: c.description })),
    sent.map(s => ({ name: s.name, description: s.description })),
    "each answer is its own request's category"
  )
  t.equal(new Set(created.map(c => c.id)).size, 200, 'distinct ids')
  responses.forEach((res, i) => {
    t.equal(res.headers.location, `/v1/categories/${created[i]?.id ?? ''}`)
  })

  const listed = new Map(
    (
      (await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })).json() as Array<{
        id: number
        name: string
        description?: string
      }>
    ).map(c => [c.id, c])
  )
  t.ok(
    created.every(c => JSON.stringify(listed.get(c.id)) === JSON.stringify(c)),
    'every created category is listed under its id, exactly as answered'
  )

  const after = await histogram(app, 'categories_insert_batch_rows')
  t.equal(after.sum - before.sum, 200, 'every row went through a batch')
  t.ok(
    after.count - before.count < 200,
    `${after.count - before.count} INSERTs for 200 rows: some carried more than one row`
  )
})

t.test('a failed batch fails every request in it with an Error body, and leaves no row', async t => {
  const locker = new pg.Client({ connectionString: db.url })
  await locker.connect()
  t.teardown(async () => {
    await locker.end()
  })
  // The list is cached before the failure (the change feed is up once a first read was served from the cache).
  const reads = async (source: string): Promise<number> => await metric(app, 'categories_list_reads_total', { source })
  const deadline = Date.now() + 10000
  const cacheReads = await reads('cache')
  while ((await reads('cache')) === cacheReads && Date.now() < deadline) {
    await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  }
  t.ok((await reads('cache')) > cacheReads, 'the list is served from the cache')
  await locker.query('BEGIN')
  await locker.query('LOCK TABLE categories IN ACCESS EXCLUSIVE MODE')

  const before = await histogram(app, 'categories_insert_batch_rows')
  const responses = await Promise.all(
    Array.from(
      { length: 20 },
      async (_, i) => await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name: `doomed-${i}` }) })
    )
  )
  await locker.query('ROLLBACK')
  for (const res of responses) {
    t.equal(res.statusCode, 503)
    t.same(res.json(), {
      code: 'SERVICE_UNAVAILABLE',
      message: 'the database is unavailable; retry shortly',
      status: 503
    })
    t.equal(res.headers['retry-after'], '1')
  }
  const after = await histogram(app, 'categories_insert_batch_rows')
  t.ok(after.count - before.count < 20, 'the failed requests shared batches')
  const { rows } = await locker.query<{ n: number }>(
    "SELECT count(*)::int AS n FROM categories WHERE name LIKE 'doomed-%'"
  )
  t.equal(rows[0]?.n, 0, 'no row left behind')
  // A failed batch may have committed before its answer was lost, and its echo is skipped: the cache must drop the list
  // itself.
  const refreshes = await reads('refresh')
  await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  t.equal(await reads('refresh'), refreshes + 1, 'the next list read rebuilt the list')

  const ok = await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name: 'after the lock' }) })
  t.equal(ok.statusCode, 201, 'creates work again once the table is free')
})

t.test("insertWith: one row inside the caller's transaction", async t => {
  const table = new Table<NewCategory, Category>(app.db, 'categories', { name: 'text', description: 'text' })
  await app.db.withClient(async client => {
    await client.query('BEGIN')
    const rolledBack = await table.insertWith(client, { name: 'rolled back' })
    await client.query('ROLLBACK')
    t.equal(await table.get(rolledBack.id), undefined, 'gone with its transaction')
    await client.query('BEGIN')
    const kept = await table.insertWith(client, { name: 'kept', description: 'd' })
    await client.query('COMMIT')
    t.same((await table.get(kept.id))?.row, { id: kept.id, name: 'kept', description: 'd' })
  })
})
