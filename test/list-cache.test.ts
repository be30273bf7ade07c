import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyInstance } from 'fastify'
import pg from 'pg'
import t from 'tap'
import { LISTENER_APPLICATION_NAME } from '../src/categories/change-feed.js'
import { ifNoneMatchHits } from '../src/categories/list-cache.js'
import { testApp, AUTH, json } from './helpers/app.js'
import { testDatabase } from './helpers/database.js'

const db = await testDatabase(t)
const { app: a } = await testApp(t, db.url)
const { app: b } = await testApp(t, db.url)
const admin = new pg.Client({ connectionString: db.url })
await admin.connect()
t.teardown(async () => { await admin.end() })

async function metric (app: FastifyInstance, name: string, labels: Record<string, string> = {}): Promise<number> {
  const values = (await app.metrics.getSingleMetric(name)?.get())?.values ?? []
  const found = values.find(v => Object.entries(labels).every(([k, l]) => v.labels[k] === l))
  return found?.value ?? 0
}

async function until (what: string, check: () => Promise<boolean>, timeoutMs = 10000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`)
    await sleep(2)
  }
}

const listening = async (app: FastifyInstance): Promise<boolean> => await metric(app, 'categories_change_feed_listening') === 1
const list = async (app: FastifyInstance): Promise<Array<{ id: number, name: string }>> =>
  (await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })).json()
async function create (app: FastifyInstance, name: string): Promise<number> {
  const res = await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name }) })
  if (res.statusCode !== 201) throw new Error(`create answered ${res.statusCode}: ${res.body}`)
  return res.json().id
}

await until('both instances listen', async () => await listening(a) && await listening(b))

t.test('If-None-Match: RFC 9110 matching', async t => {
  t.ok(ifNoneMatchHits('"abc"', '"abc"'))
  t.ok(ifNoneMatchHits('"x", "abc"', '"abc"'), 'in a list')
  t.ok(ifNoneMatchHits('W/"abc"', '"abc"'), 'weak comparison')
  t.ok(ifNoneMatchHits(' * ', '"abc"'), 'any')
  t.notOk(ifNoneMatchHits(undefined, '"abc"'))
  t.notOk(ifNoneMatchHits('"abcd"', '"abc"'))
  t.notOk(ifNoneMatchHits('abc', '"abc"'), 'an unquoted tag is not the tag')
})

t.test('GET list: strong ETag, 304 on If-None-Match, a create changes the tag', async t => {
  await create(a, 'etag-1')
  const first = await a.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  t.equal(first.statusCode, 200)
  const etag = first.headers.etag as string
  t.match(etag, /^"[A-Za-z0-9_-]+"$/, 'a strong, quoted tag')
  t.equal(first.headers['cache-control'], 'no-cache')
  t.match(first.headers['content-type'], /^application\/json; charset=utf-8$/)

  for (const header of [etag, `"other", ${etag}`, `W/${etag}`, '*']) {
    const res = await a.inject({ method: 'GET', url: '/v1/categories', headers: { ...AUTH, 'if-none-match': header } })
    t.equal(res.statusCode, 304, header)
    t.equal(res.body, '', 'no body')
    t.equal(res.headers.etag, etag)
    t.equal(res.headers['cache-control'], 'no-cache')
  }
  const other = await a.inject({ method: 'GET', url: '/v1/categories', headers: { ...AUTH, 'if-none-match': '"stale"' } })
  t.equal(other.statusCode, 200)
  t.equal(other.body, first.body)

  const onB = await b.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  t.equal(onB.headers.etag, etag, 'the same list has the same tag on every instance')

  await create(a, 'etag-2')
  const after = await a.inject({ method: 'GET', url: '/v1/categories', headers: { ...AUTH, 'if-none-match': etag } })
  t.equal(after.statusCode, 200, 'the old tag no longer matches')
  t.not(after.headers.etag, etag)
  t.ok(after.json().some((c: { name: string }) => c.name === 'etag-2'))
})

t.test('the cached body is what the schema serializes from the database', async t => {
  await list(a)
  const before = await metric(a, 'categories_list_reads_total', { source: 'cache' })
  const cached = await a.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  t.ok(await metric(a, 'categories_list_reads_total', { source: 'cache' }) > before, 'served from the cache')
  const { rows } = await admin.query<{ id: string, name: string, description: string | null }>('SELECT id::text, name, description FROM categories ORDER BY id')
  t.equal(cached.body, `[${rows.map(r => `{"id":${r.id},"name":${JSON.stringify(r.name)}${r.description === null ? '' : `,"description":${JSON.stringify(r.description)}`}}`).join(',')}]`)
})

t.test('a 201 is in the next list on its own instance, with no delay', async t => {
  await list(a)
  for (let i = 0; i < 20; i++) {
    const id = await create(a, `own-${i}`)
    t.ok((await list(a)).some(c => c.id === id), `own-${i} listed at once`)
  }
})

t.test('a 201 on one instance is in the list on another within 100 ms', async t => {
  for (let i = 0; i < 10; i++) {
    await list(b) // B holds a cached list
    const id = await create(a, `cross-${i}`)
    const answered = performance.now()
    let elapsed = 0
    let seen = false
    while (!seen && elapsed <= 100) {
      // app.inject never touches a socket: yield to the event loop so B's listening connection is read, as with real traffic.
      await sleep(1)
      seen = (await list(b)).some(c => c.id === id)
      elapsed = performance.now() - answered
    }
    t.ok(seen && elapsed <= 100, `cross-${i} visible on B after ${elapsed.toFixed(1)} ms`)
  }
})

t.test('listener killed: the list comes from the database until the feed is back, then from the cache', async t => {
  await list(a)
  const drops = await metric(a, 'categories_change_feed_drops')
  const { rowCount } = await admin.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()', [LISTENER_APPLICATION_NAME])
  t.equal(rowCount, 2, 'one listening connection per instance')
  await until('A notices the drop', async () => await metric(a, 'categories_change_feed_drops') > drops)
  t.notOk(await listening(a), 'A is not listening')

  const fromDatabase = await metric(a, 'categories_list_reads_total', { source: 'database' })
  const id = await create(b, 'while-disconnected')
  t.ok((await list(a)).some(c => c.id === id), 'a create on B is visible on A at once')
  t.ok(await metric(a, 'categories_list_reads_total', { source: 'database' }) > fromDatabase, 'A read the database, not its cache')

  await until('A listens again', async () => await listening(a))
  await until('B listens again', async () => await listening(b))
  const id2 = await create(b, 'after-reconnect')
  t.ok((await list(a)).some(c => c.id === id2) || (await sleep(100), (await list(a)).some(c => c.id === id2)), 'a create on B after the reconnect reaches A')
  const cacheReads = await metric(a, 'categories_list_reads_total', { source: 'cache' })
  await list(a)
  await list(a)
  t.ok(await metric(a, 'categories_list_reads_total', { source: 'cache' }) > cacheReads, 'A serves from its cache again')
})
