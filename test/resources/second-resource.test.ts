import type { FastifyInstance } from 'fastify'
import pg from 'pg'
import t from 'tap'
import { runMigrations } from '../../src/db/migrate.js'
import { AUTH, json, metric, testApp, until } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { registerWidgets as register, widgetsMigration } from '../widgets/setup.js'

/*
 * The machinery serves a second resource: widgets (test/widgets/, a test-only
 * resource made as docs/architecture.md says) next to categories, on the same
 * change feed, pool and Idempotency-Key table, in two instances.
 */

const db = await testDatabase(t)
await runMigrations(db.url, { info () {}, warn () {}, error () {} })
const admin = new pg.Client({ connectionString: db.url })
await admin.connect()
t.teardown(async () => {
  await admin.end()
})
await admin.query(widgetsMigration)
const { app: a } = await testApp(t, db.url, {}, { register })
const { app: b } = await testApp(t, db.url, {}, { register })

const names = async (app: FastifyInstance, path: string): Promise<string[]> =>
  ((await app.inject({ method: 'GET', url: path, headers: AUTH })).json() as Array<{ name: string }>).map(w => w.name)
async function create (
  app: FastifyInstance,
  path: string,
  name: string,
  headers: Record<string, string> = {}
): Promise<{ status: number; body: { id: number; name: string }; headers: Record<string, unknown> }> {
  const request = json({ name })
  const res = await app.inject({
    method: 'POST',
    url: path,
    headers: { ...request.headers, ...headers },
    payload: request.payload
  })
  return { status: res.statusCode, body: res.json(), headers: res.headers }
}

for (const app of [a, b]) {
  await until('the feed hears', async () => (await metric(app, 'change_feed_listening')) === 1)
}

t.test("a create is in its own instance's list at once, and in the other's once the feed tells it", async t => {
  t.same(await names(a, '/v1/widgets'), [], 'empty at first')
  const created = await create(a, '/v1/widgets', 'sprocket')
  t.equal(created.status, 201)
  t.match(created.headers.location, /^\/v1\/widgets\/\d+$/)
  t.same(await names(a, '/v1/widgets'), ['sprocket'], 'on A at once: the write path told its cache')
  t.ok(
    (await metric(a, 'widgets_list_reads_total', { source: 'changed' })) >= 1,
    "appended to A's cached list, not re-read"
  )

  await names(b, '/v1/widgets') // B caches its list
  await create(a, '/v1/widgets', 'cog')
  await until("B sees A's create", async () => (await names(b, '/v1/widgets')).includes('cog'))
  t.same(await names(b, '/v1/widgets'), ['sprocket', 'cog'])
})

t.test('a change to widgets drops only the widget list: the category list stays cached', async t => {
  await names(a, '/v1/categories')
  await names(a, '/v1/categories')
  const refreshes = await metric(a, 'categories_list_reads_total', { source: 'refresh' })
  const cacheHits = await metric(a, 'categories_list_reads_total', { source: 'cache' })
  await names(a, '/v1/widgets')
  await create(b, '/v1/widgets', 'gear')
  await until("A sees B's create", async () => (await names(a, '/v1/widgets')).includes('gear'))
  await names(a, '/v1/categories')
  t.equal(await metric(a, 'categories_list_reads_total', { source: 'refresh' }), refreshes, 'no category rebuild')
  t.equal(await metric(a, 'categories_list_reads_total', { source: 'cache' }), cacheHits + 1, 'served from the cache')
})

t.test(
  'the recipe also gives widgets GET with ETag, PATCH, DELETE, If-Match and pages, followed by both instances',
  async t => {
    const { body: made } = await create(a, '/v1/widgets', 'spanner')
    const got = await b.inject({ method: 'GET', url: `/v1/widgets/${made.id}`, headers: AUTH })
    t.match(got.headers.etag, /^"[^"]+"$/)
    const patched = await b.inject({
      method: 'PATCH',
      url: `/v1/widgets/${made.id}`,
      headers: { ...AUTH, 'content-type': 'application/merge-patch+json', 'if-match': got.headers.etag as string },
      payload: '{"name":"wrench"}'
    })
    t.same(patched.json(), { id: made.id, name: 'wrench' })
    const stale = await a.inject({
      method: 'DELETE',
      url: `/v1/widgets/${made.id}`,
      headers: { ...AUTH, 'if-match': got.headers.etag as string }
    })
    t.equal(stale.statusCode, 412, 'the tag before the update is stale')
    t.equal(
      stale.json().message,
      `widget ${made.id} has changed since it was read: If-Match does not name its current ETag`
    )
    await until('A lists the update', async () => (await names(a, '/v1/widgets')).includes('wrench'), 1000)
    const nameless = await a.inject({ method: 'PATCH', url: `/v1/widgets/${made.id}`, ...json({ name: null }) })
    t.equal(nameless.json().message, "'name' must be of type string", 'a required member cannot be removed')
    const page = await a.inject({ method: 'GET', url: '/v1/widgets?limit=1', headers: AUTH })
    t.same(
      page.json().map((w: { name: string }) => w.name),
      ['sprocket']
    )
    t.match(page.headers.link, /^<\/v1\/widgets\?limit=1&after=\d+>; rel="next"$/)
    t.equal((await a.inject({ method: 'DELETE', url: `/v1/widgets/${made.id}`, headers: AUTH })).statusCode, 204)
    await until('B no longer lists it', async () => !(await names(b, '/v1/widgets')).includes('wrench'), 1000)
    const document = (await a.inject({ method: 'GET', url: '/docs/openapi.json' })).json()
    t.same(Object.keys(document.paths['/widgets/{id}']).sort(), ['delete', 'get', 'patch'])
    t.equal(document.paths['/widgets/{id}'].patch.operationId, 'updateWidget')
    t.equal(document.paths['/widgets/{id}'].delete['x-stability'], 'experimental')
  }
)

t.test(
  'an Idempotency-Key belongs to its operation: another operation never replays its answer, it refuses the key',
  async t => {
    const key = { 'idempotency-key': 'shared-key-1' }
    const category = await create(a, '/v1/categories', 'same name', key)
    t.equal(category.status, 201)
    const widget = await create(a, '/v1/widgets', 'same name', key)
    t.equal(widget.status, 422, 'the same key for another operation: 422, not the category replayed')
    t.match(widget.body, { code: 'IDEMPOTENCY_KEY_REUSED', message: /another operation/, status: 422 })
    t.notOk('idempotent-replayed' in widget.headers)
    const categoryAgain = await create(b, '/v1/categories', 'same name', key)
    t.equal(categoryAgain.headers['idempotent-replayed'], 'true', "the category's own retry replays")
    t.same(categoryAgain.body, category.body)

    const widgetKey = { 'idempotency-key': 'widget-key-1' }
    const created = await create(a, '/v1/widgets', 'same name', widgetKey)
    t.equal(created.status, 201)
    t.match(created.headers.location, /^\/v1\/widgets\//)
    const again = await create(b, '/v1/widgets', 'same name', widgetKey)
    t.equal(again.headers['idempotent-replayed'], 'true', "the widget's own retry replays")
    t.same(again.body, created.body)
    t.equal(
      (await create(b, '/v1/widgets', 'other name', widgetKey)).status,
      422,
      'another body for the same operation and key'
    )
    t.equal(
      (await create(b, '/v1/categories', 'same name', widgetKey)).status,
      422,
      "and the widget's key for a category"
    )
    const { rows } = await admin.query<{ idempotency_key: string; operation: string }>(
      `SELECT idempotency_key, operation FROM idempotency_keys
      WHERE idempotency_key = ANY($1) ORDER BY idempotency_key`,
      [['shared-key-1', 'widget-key-1']]
    )
    t.same(
      rows,
      [
        { idempotency_key: 'shared-key-1', operation: 'createCategory' },
        { idempotency_key: 'widget-key-1', operation: 'createWidget' }
      ],
      'each record names its operation'
    )
    t.same(
      await names(a, '/v1/widgets'),
      ['sprocket', 'cog', 'gear', 'same name'],
      'the idempotent create is in the list too'
    )
  }
)

t.test('each resource has its own metrics, the change feed one set for the process', async t => {
  const exposed = await a.metrics.metrics()
  for (const prefix of ['categories', 'widgets']) {
    for (const name of [
      'list_reads_total',
      'list_own_echoes_total',
      'insert_batch_rows',
      'insert_batch_failures_total'
    ]) {
      t.match(exposed, new RegExp(`^# TYPE ${prefix}_${name} `, 'm'), `${prefix}_${name}`)
    }
  }
  for (const name of ['change_feed_listening', 'change_feed_drops_total', 'change_feed_probes_missed_total']) {
    t.equal(exposed.match(new RegExp(`^# TYPE ${name} `, 'gm'))?.length, 1, `${name}, once`)
  }
  t.ok((await metric(a, 'widgets_list_own_echoes_total')) >= 1, 'A skipped the echo of its own widget writes')
})

t.test(
  'a resource whose table lacks its change-notification triggers cannot go unnoticed: the app refuses',
  async t => {
    const migrated = async (...statements: string[]): Promise<string> => {
      const url = await db.createDatabase()
      await runMigrations(url, { info () {}, warn () {}, error () {} })
      const owner = new pg.Client({ connectionString: url })
      await owner.connect()
      for (const statement of statements) await owner.query(statement)
      await owner.end()
      return url
    }
    const refusal = {
      name: 'StartupError',
      // An applied migration is not run again: fixing it helps nothing, so the advice is a new one.
      message: new RegExp('^table widgets lacks its change-notification triggers: ' +
        "run SELECT announce_changes\\('widgets'\\) in a new migration")
    }
    await t.rejects(
      testApp(t, await migrated(), {}, { register }),
      { name: 'StartupError', message: /^table widgets does not exist/ },
      'no table: its migration was not applied'
    )
    for (const trigger of ['widgets_inserted', 'widgets_updated', 'widgets_deleted', 'widgets_truncated']) {
      await t.rejects(
        testApp(t, await migrated(widgetsMigration, `DROP TRIGGER ${trigger} ON widgets`), {}, { register }),
        refusal,
        `without ${trigger}`
      )
    }
    await t.rejects(
      testApp(
        t,
        await migrated(widgetsMigration, 'ALTER TABLE widgets DISABLE TRIGGER widgets_updated'),
        {},
        { register }
      ),
      refusal,
      'a disabled trigger is no trigger'
    )
    // The 1.0 recipe's triggers: any update or delete said only that something changed.
    const baselineTriggers = [
      'DROP TRIGGER widgets_updated ON widgets',
      'DROP TRIGGER widgets_deleted ON widgets',
      'DROP TRIGGER widgets_truncated ON widgets',
      `CREATE TRIGGER widgets_changed AFTER UPDATE OR DELETE OR TRUNCATE ON widgets
      FOR EACH STATEMENT EXECUTE FUNCTION notify_table_change()`
    ]
    await t.rejects(
      testApp(t, await migrated(widgetsMigration, ...baselineTriggers), {}, { register }),
      refusal,
      "the 1.0 recipe's triggers are not enough"
    )
    await t.resolves(testApp(t, await migrated(widgetsMigration), {}, { register }), 'with all four, it starts')
  }
)

t.test('a schema member without its column is refused at start, naming the table and the column', async t => {
  const url = await db.createDatabase()
  await runMigrations(url, { info () {}, warn () {}, error () {} })
  const owner = new pg.Client({ connectionString: url })
  await owner.connect()
  await owner.query(widgetsMigration)
  await owner.query('ALTER TABLE widgets RENAME COLUMN name TO title')
  await owner.end()
  await t.rejects(testApp(t, url, {}, { register }), {
    name: 'StartupError',
    message: "table widgets has no column name, which its schema's member needs: add it in a new migration"
  })
})

t.test(
  "a row the table's own constraints refuse: 409 or 400 in the Error shape, and only for that request",
  async t => {
    const url = await db.createDatabase()
    await runMigrations(url, { info () {}, warn () {}, error () {} })
    const owner = new pg.Client({ connectionString: url })
    await owner.connect()
    await owner.query(widgetsMigration)
    await owner.query("ALTER TABLE widgets ADD UNIQUE (name), ADD CHECK (name <> 'forbidden')")
    await owner.end()
    const { app } = await testApp(t, url, {}, { register })
    t.equal((await create(app, '/v1/widgets', 'taken')).status, 201)
    // One group commit: a refused row must not fail the others batched with it.
    const batch = await Promise.all(
      ['taken', 'free-1', 'forbidden', 'free-2'].map(async name => await create(app, '/v1/widgets', name))
    )
    t.same(
      batch.map(res => res.status),
      [409, 201, 400, 201]
    )
    t.same(batch[0]?.body, {
      code: 'CONFLICT',
      message: 'a stored row already holds a value of this request that must be unique',
      status: 409
    })
    t.same(batch[2]?.body, {
      code: 'VALIDATION_FAILED',
      message: 'the request breaks a rule of the stored data',
      status: 400
    })
    const idempotent = await create(app, '/v1/widgets', 'taken', { 'idempotency-key': 'conflict-1' })
    t.equal(idempotent.status, 409, 'with an Idempotency-Key too')
    t.same(
      await names(app, '/v1/widgets'),
      ['taken', 'free-1', 'free-2'],
      'the list holds the committed rows, nothing else'
    )
  }
)
