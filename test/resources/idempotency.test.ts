import { randomUUID } from 'node:crypto'
import type { LightMyRequestResponse } from 'fastify'
import t from 'tap'
import pg from 'pg'
import { IdempotencyStore } from '../../src/machinery/idempotency.js'
import { testApp, until, AUTH, OTHER_KEY, TEST_KEY } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { lockCategories, lockWaiter } from '../helpers/pg-client.js'

const db = await testDatabase(t)
/** How long a create of the race may wait for a connection. */
const RACE_CONNECTION_WAIT_MS = 30_000
const { app } = await testApp(t, db.url)
const admin = new pg.Client({ connectionString: db.url })
await admin.connect()
t.teardown(async () => {
  await admin.end()
})

async function create (body: unknown, key?: string, apiKey = TEST_KEY, target = app): Promise<LightMyRequestResponse> {
  const headers: Record<string, string> = { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' }
  if (key !== undefined) headers['idempotency-key'] = key
  return await target.inject({
    method: 'POST',
    url: '/v1/categories',
    headers,
    payload: typeof body === 'string' ? body : JSON.stringify(body)
  })
}

async function rowsNamed (name: string): Promise<number> {
  const { rows } = await admin.query('SELECT count(*)::int AS n FROM categories WHERE name = $1', [name])
  return rows[0].n
}

t.test('the same key and body replays the first answer, with no new row', async t => {
  const first = await create({ name: 'replayed', description: 'd' }, 'key-1')
  t.equal(first.statusCode, 201)
  t.equal(first.headers['idempotent-replayed'], undefined)
  const again = await create({ name: 'replayed', description: 'd' }, 'key-1')
  t.equal(again.statusCode, 201)
  t.equal(again.headers['idempotent-replayed'], 'true')
  t.equal(again.body, first.body, 'same body, byte for byte (same id)')
  t.equal(again.headers.location, first.headers.location)
  t.match(again.headers['content-type'], /^application\/json; charset=utf-8$/)
  const reordered = await create('{ "description": "d",  "name": "replayed" }', 'key-1')
  t.equal(reordered.headers['idempotent-replayed'], 'true', 'member order and spacing do not make another body')
  t.equal(await rowsNamed('replayed'), 1)
})

t.test('the same key with a different body is 422 IDEMPOTENCY_KEY_REUSED', async t => {
  t.equal((await create({ name: 'original' }, 'key-2')).statusCode, 201)
  for (const body of [{ name: 'other' }, { name: 'original', description: '' }]) {
    const res = await create(body, 'key-2')
    t.equal(res.statusCode, 422)
    t.same(res.json(), { code: 'IDEMPOTENCY_KEY_REUSED', message: res.json().message, status: 422 })
  }
  t.equal(await rowsNamed('other'), 0)
})

t.test('keys are scoped to the API key that sent them', async t => {
  const mine = await create({ name: 'scoped' }, 'shared-key')
  const theirs = await create({ name: 'scoped' }, 'shared-key', OTHER_KEY)
  t.equal(mine.statusCode, 201)
  t.equal(theirs.statusCode, 201)
  t.equal(theirs.headers['idempotent-replayed'], undefined)
  t.not(theirs.json().id, mine.json().id)
  t.equal(
    (await create({ name: 'different' }, 'shared-key', OTHER_KEY)).statusCode,
    422,
    'the other key has its own record'
  )
})

t.test('a malformed Idempotency-Key is 400 naming the header', async t => {
  for (const key of ['', ' ', 'has space', 'x'.repeat(256), 'caf\u00e9', 'tab\there']) {
    const res = await app.inject({
      method: 'POST',
      url: '/v1/categories',
      headers: { ...AUTH, 'content-type': 'application/json', 'idempotency-key': key },
      payload: '{"name":"bad-key"}'
    })
    t.equal(res.statusCode, 400, JSON.stringify(key))
    t.equal(res.json().code, 'VALIDATION_FAILED')
    t.match(res.json().message, /idempotency-key/i)
  }
  t.equal((await create({ name: 'max-key' }, 'k'.repeat(255))).statusCode, 201, '255 characters is fine')
  t.equal(await rowsNamed('bad-key'), 0)
})

t.test('while the first request runs, the same key is 409 with Retry-After; then it replays', async t => {
  const blocker = await lockCategories(t, db.url, 'EXCLUSIVE')
  const first = create({ name: 'slow' }, 'key-3')
  // The first request holds the key once its INSERT waits for the table lock.
  await until('the first create waits for the table lock', async () => await lockWaiter(admin))
  const second = await create({ name: 'slow' }, 'key-3')
  t.equal(second.statusCode, 409)
  t.equal(second.json().code, 'IDEMPOTENCY_KEY_IN_USE')
  t.equal(second.headers['retry-after'], '1')
  await blocker.query('COMMIT')
  t.equal((await first).statusCode, 201)
  t.equal((await create({ name: 'slow' }, 'key-3')).headers['idempotent-replayed'], 'true')
  t.equal(await rowsNamed('slow'), 1)
})

t.test('a failed request leaves neither a row nor a claim: an immediate retry succeeds', async t => {
  const timeoutDb = await db.createDatabase()
  const { app: strict } = await testApp(t, timeoutDb, { DB_STATEMENT_TIMEOUT_MS: '300' })
  const blocker = await lockCategories(t, timeoutDb, 'EXCLUSIVE')
  const failed = await create({ name: 'retried' }, 'key-4', TEST_KEY, strict)
  t.equal(failed.statusCode, 503)
  await blocker.query('ROLLBACK')
  const retried = await create({ name: 'retried' }, 'key-4', TEST_KEY, strict)
  t.equal(retried.statusCode, 201)
  t.equal(retried.headers['idempotent-replayed'], undefined, 'nothing was remembered from the failure')
  const count = await strict.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  t.equal((count.json() as unknown[]).length, 1, 'exactly one row')
})

t.test('two identical requests racing on two instances create one row', async t => {
  const raceDb = await db.createDatabase()
  // The race is the rule here, not the pool's wait: on a loaded machine 50 creates at once once waited past the
  // default 2 s for a connection, and got 503 (the right answer to that wait: database-faults.test.ts has its rule).
  const patient = { DB_CONNECTION_TIMEOUT_MS: String(RACE_CONNECTION_WAIT_MS) }
  const [a, b] = await Promise.all([testApp(t, raceDb, patient), testApp(t, raceDb, patient)])
  const keys = Array.from({ length: 25 }, (_, i) => `race-${i}-${randomUUID()}`)
  const answers = await Promise.all(
    keys.flatMap((key, i) => [
      create({ name: `race-${i}` }, key, TEST_KEY, a.app),
      create({ name: `race-${i}` }, key, TEST_KEY, b.app)
    ])
  )
  for (const res of answers) {
    t.ok(res.statusCode === 201 || res.statusCode === 409, `201 or 409, got ${res.statusCode}: ${res.body}`)
  }
  // B's creates reach A's list through the change feed: once A lists as many rows as keys, compare.
  const listed = async (): Promise<Array<{ id: number; name: string }>> =>
    (await a.app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })).json()
  await until('A lists a row per key', async () => (await listed()).length >= keys.length)
  const list = await listed()
  t.equal(list.length, keys.length, 'one row per key')
  t.equal(new Set(list.map(c => c.name)).size, keys.length)
  for (let i = 0; i < keys.length; i++) {
    const pair = [answers[2 * i], answers[2 * i + 1]]
    const fresh = pair.filter(r => r?.statusCode === 201 && r.headers['idempotent-replayed'] === undefined)
    t.equal(fresh.length, 1, `key ${i}: exactly one fresh 201`)
    for (const r of pair) {
      if (r?.statusCode === 201) t.equal(r.json().id, fresh[0]?.json().id, 'a replay carries the same id')
    }
  }
})

t.test('records expire after 24 hours; cleanup deletes expired records', async t => {
  // An expired record no longer binds the key.
  t.equal((await create({ name: 'old' }, 'key-5')).statusCode, 201)
  await admin.query(
    "UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE idempotency_key = 'key-5'"
  )
  const fresh = await create({ name: 'new body' }, 'key-5')
  t.equal(fresh.statusCode, 201)
  t.equal(fresh.headers['idempotent-replayed'], undefined)

  await admin.query(
    "UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE idempotency_key IN ('key-1', 'key-2')"
  )
  const deleted = await new IdempotencyStore(app.db).deleteExpired(1)
  t.equal(deleted, 2, 'expired records deleted, in batches of 1')
  const { rows } = await admin.query(
    "SELECT count(*)::int AS n FROM idempotency_keys WHERE idempotency_key IN ('key-1', 'key-2')"
  )
  t.equal(rows[0].n, 0)
})

t.test('the OpenAPI document describes the header and the 409/422 answers', async t => {
  const doc = (await app.inject({ method: 'GET', url: '/docs/openapi.json' })).json()
  const op = doc.paths['/categories'].post
  const header = op.parameters.find(
    (p: { in: string; name: string }) => p.in === 'header' && p.name.toLowerCase() === 'idempotency-key'
  )
  t.ok(header, 'Idempotency-Key parameter')
  t.equal(header.schema.maxLength, 255)
  t.ok(op.responses['409'])
  t.ok(op.responses['422'])
})
