import { createHash } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyInstance } from 'fastify'
import pg from 'pg'
import { Registry } from 'prom-client'
import t from 'tap'
import type { Category, NewCategory } from '../../src/categories/schemas.js'
import { Database } from '../../src/db/database.js'
import { POOL_QUEUE_FULL } from '../../src/db/errors.js'
import { Table } from '../../src/db/table.js'
import { ifNoneMatchHits } from '../../src/http/replies.js'
import {
  ChangeFeed,
  LISTENER_APPLICATION_NAME,
  notifyThrough,
  type ChangeFeedOptions
} from '../../src/machinery/change-feed.js'
import { ListCache, type ListSource } from '../../src/machinery/list-cache.js'
import type { ListBody } from '../../src/machinery/segmented-list.js'
import { testApp, AUTH, json, metric, until } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { categoryJson, expectedListBody } from '../helpers/list-body.js'

const db = await testDatabase(t)
const dbUrl = db.url
const { app: a } = await testApp(t, db.url)
const { app: b } = await testApp(t, db.url)
const admin = new pg.Client({ connectionString: db.url })
await admin.connect()
t.teardown(async () => {
  await admin.end()
})

const listening = async (app: FastifyInstance): Promise<boolean> => (await metric(app, 'change_feed_listening')) === 1
const list = async (app: FastifyInstance): Promise<Array<{ id: number; name: string }>> =>
  (await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })).json()
async function create (app: FastifyInstance, name: string): Promise<number> {
  const res = await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name }) })
  if (res.statusCode !== 201) throw new Error(`create answered ${res.statusCode}: ${res.body}`)
  return res.json().id
}

const expectedBody = async (): Promise<string> => await expectedListBody(admin)
/**
 * The list's tag, computed here from the table: the SHA-1 of the SHA-1s of its segments, each the JSON of the rows
 * whose ids share id / 4096, joined by commas (machinery/segmented-list.ts).
 */
async function expectedTag (): Promise<string> {
  const { rows } = await admin.query<{ id: string; name: string; description: string | null }>(
    'SELECT id::text, name, description FROM categories ORDER BY categories.id'
  )
  const segments = new Map<bigint, string[]>()
  for (const row of rows) {
    const key = BigInt(row.id) / 4096n
    segments.set(key, [...(segments.get(key) ?? []), categoryJson(row)])
  }
  const tag = createHash('sha1')
  for (const items of segments.values()) tag.update(createHash('sha1').update(items.join(',')).digest())
  return `"${tag.digest('base64url')}"`
}
/** A list body as text, whether one Buffer or its parts. */
const bodyText = (list: ListBody): string =>
  (Buffer.isBuffer(list.body) ? list.body : Buffer.concat(list.body)).toString('utf8')
const reads = async (app: FastifyInstance | Registry, source: string): Promise<number> =>
  await metric(app, 'categories_list_reads_total', { source })

/** Own updates of one row answered at once, each after another version of the row was announced. */
const BUSY_ROW_UPDATES = 20

await until('both instances listen', async () => (await listening(a)) && (await listening(b)))

/** The categories' list cache on a change feed of its own, as the app wires it (machinery/collection.ts), started. */
function categoryListCache (
  source: ListSource<Category>,
  options: ChangeFeedOptions & { registry?: Registry }
): { cache: ListCache<Category>; feed: ChangeFeed; close: () => Promise<void> } {
  const feed = new ChangeFeed(options)
  const cache = new ListCache(source, feed, categoryJson, options.registry)
  feed.start()
  return {
    cache,
    feed,
    close: async () => {
      await feed.close()
    }
  }
}

/** A Database of the test's own on this file's database. */
function database (
  t: { teardown: (fn: () => Promise<void>) => void },
  options: Partial<ConstructorParameters<typeof Database>[0]> = {}
): Database {
  const db = new Database({
    connectionString: dbUrl,
    applicationName: 'petstore/list-cache-test',
    max: 4,
    maxWaiting: 200,
    connectionTimeoutMs: 2000,
    statementTimeoutMs: 5000,
    log: () => {},
    ...options
  })
  t.teardown(async () => {
    await db.end()
  })
  return db
}
const categoriesOf = (db: Database): Table<NewCategory, Category> =>
  new Table(db, 'categories', { name: 'text', description: 'text' })

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
  const other = await a.inject({
    method: 'GET',
    url: '/v1/categories',
    headers: { ...AUTH, 'if-none-match': '"stale"' }
  })
  t.equal(other.statusCode, 200)
  t.equal(other.body, first.body)

  // B holds its list since it started (a warm start): it has the create once the feed has told it.
  await until(
    'B lists the create',
    async () => (await b.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })).headers.etag === etag
  )
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
  t.ok((await metric(a, 'categories_list_reads_total', { source: 'cache' })) > before, 'served from the cache')
  t.equal(cached.body, await expectedBody())
})

t.test(
  'own creates are added to the cached list: no rebuild, their echoes skipped, the same bytes and tag as a rebuild',
  async t => {
    await list(a)
    const refreshes = await reads(a, 'refresh')
    const appended = await reads(a, 'changed')
    const echoes = await metric(a, 'categories_list_own_echoes_total')
    const bodies = [
      { name: 'append "quoted" \\ backslash' },
      { name: 'append \u00fcn\u00efc\u00f6d\u00e9 \u{1F408}', description: 'line\nbreak\ttab \u2028 separator' },
      { name: 'append empty description', description: '' }
    ]
    for (const body of bodies) {
      const res = await a.inject({ method: 'POST', url: '/v1/categories', ...json(body) })
      t.equal(res.statusCode, 201)
    }
    const together = await Promise.all(
      Array.from({ length: 5 }, async (_, i) => await create(a, `append together ${i}`))
    )
    // Each INSERT statement notifies once: at least one echo per sequential create and one for the concurrent ones.
    await until(
      'the echoes of these creates arrived',
      async () => (await metric(a, 'categories_list_own_echoes_total')) >= echoes + bodies.length + 1
    )

    const res = await a.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
    t.equal(await reads(a, 'refresh'), refreshes, 'A did not rebuild its list from the database')
    t.ok((await reads(a, 'changed')) > appended, 'A added its own rows')
    const ids = (res.json() as Array<{ id: number }>).map(c => c.id)
    t.ok(
      together.every(id => ids.includes(id)),
      'the concurrent creates are listed'
    )
    t.equal(res.body, await expectedBody(), 'byte for byte the list the table holds')
    t.equal(res.headers.etag, await expectedTag(), "the tag is the list's")
    const onB = await b.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
    t.equal(onB.headers.etag, res.headers.etag, 'B, which rebuilt from the database, has the same tag')
    t.equal(onB.body, res.body)
  }
)

t.test('an own row whose id sorts before the last listed one is added in id order, without a rebuild', async t => {
  // A row from elsewhere whose id is far above the sequence: later creates get lower ids.
  const { rows } = await admin.query<{ id: string }>(`INSERT INTO categories (id, name)
    SELECT last_value + 1000000, 'high id from elsewhere' FROM categories_id_seq RETURNING id::text`)
  const high = Number(rows[0]?.id)
  await until('A lists the high id', async () => (await list(a)).some(c => c.id === high))
  const refreshes = await reads(a, 'refresh')
  const id = await create(a, 'below the high id')
  t.ok(id < high, 'the new id sorts before the last listed one')
  const listed = (await list(a)).map(c => c.id)
  t.ok(listed.includes(id), 'listed at once')
  t.same(
    listed,
    [...listed].sort((x, y) => x - y),
    'in id order'
  )
  t.equal(await reads(a, 'refresh'), refreshes, 'added to its segment, not rebuilt')
  t.equal(
    (await a.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })).body,
    await expectedBody(),
    "byte for byte the table's list"
  )
  // Later tests want new ids to sort last again.
  await admin.query('DELETE FROM categories WHERE id = $1', [high])
  await until('A no longer lists the high id', async () => !(await list(a)).some(c => c.id === high))
})

t.test('a 201 is in the next list on its own instance, with no delay', async t => {
  await list(a)
  for (let i = 0; i < 20; i++) {
    const id = await create(a, `own-${i}`)
    t.ok(
      (await list(a)).some(c => c.id === id),
      `own-${i} listed at once`
    )
  }
})

t.test('a 201 on one instance reaches the list on another, as soon as its notification is read', async t => {
  for (let i = 0; i < 10; i++) {
    await list(b) // B holds a cached list
    const id = await create(a, `cross-${i}`)
    const answered = performance.now()
    // app.inject never touches a socket: until's pauses let B's listening connection be read, as with real traffic.
    await until(`cross-${i} listed on B`, async () => (await list(b)).some(c => c.id === id))
    t.comment(`cross-${i} listed on B ${(performance.now() - answered).toFixed(1)} ms after the 201`)
    t.pass(`cross-${i} listed on B`)
  }
})

t.test(
  "a create on another instance is added to this one's list by id: no rebuild, the same bytes and tag everywhere",
  async t => {
    await list(b)
    const refreshes = await reads(b, 'refresh')
    const appended = await reads(b, 'changed')
    const ids = await Promise.all(['from A 1', 'from A 2', 'from A 3'].map(async name => await create(a, name)))
    await until("B lists A's creates", async () => {
      const listed = (await list(b)).map(c => c.id)
      return ids.every(id => listed.includes(id))
    })
    t.equal(await reads(b, 'refresh'), refreshes, 'B did not rebuild its list')
    t.ok((await reads(b, 'changed')) > appended, 'B added the rows it was told of')
    const onA = await a.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
    const onB = await b.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
    t.equal(onB.body, await expectedBody(), "byte for byte the table's list")
    t.equal(onB.headers.etag, onA.headers.etag, 'the same tag on both instances')
    t.equal(onB.headers.etag, await expectedTag(), "the list's tag")
  }
)

t.test('rows that commit out of id order are listed in id order on every instance, without a rebuild', async t => {
  await list(a)
  await list(b)
  const refreshes = { a: await reads(a, 'refresh'), b: await reads(b, 'refresh') }
  // A transaction takes an id, and commits only after later ids have committed through both instances.
  const early = new pg.Client({ connectionString: db.url })
  await early.connect()
  t.teardown(async () => {
    await early.end()
  })
  await early.query('BEGIN')
  const { rows } = await early.query<{ id: string }>(
    "INSERT INTO categories (name) VALUES ('taken early, committed late') RETURNING id::text"
  )
  const earlyId = Number(rows[0]?.id)
  const later = [await create(a, 'later on A'), await create(b, 'later on B'), await create(a, 'later on A again')]
  t.ok(
    later.every(id => id > earlyId),
    'the later creates have higher ids'
  )
  for (const app of [a, b]) {
    await until('both list the later creates', async () => {
      const listed = (await list(app)).map(c => c.id)
      return later.every(id => listed.includes(id))
    })
  }
  await early.query('COMMIT')
  for (const app of [a, b]) {
    await until('both list the early id', async () => (await list(app)).some(c => c.id === earlyId))
  }
  const expected = await expectedBody()
  const answers = await Promise.all(
    [a, b].map(async app => await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH }))
  )
  t.same(
    answers.map(res => res.body === expected),
    [true, true],
    "each instance's list is byte for byte the table's, in id order"
  )
  t.equal(answers[0]?.headers.etag, answers[1]?.headers.etag, 'with the same tag')
  t.same({ a: await reads(a, 'refresh'), b: await reads(b, 'refresh') }, refreshes, 'neither rebuilt its list')
})

t.test(
  'a change the notification cannot name drops the list: an insert, update or delete of too many rows',
  async t => {
    for (const change of [
      "INSERT INTO categories (name) SELECT 'many ' || i FROM generate_series(1, 2000) AS i",
      "UPDATE categories SET description = 'many' WHERE name LIKE 'many %'",
      "DELETE FROM categories WHERE name LIKE 'many %'"
    ]) {
      await list(b)
      const refreshes = await reads(b, 'refresh')
      await admin.query(change)
      await until('B rebuilt its list', async () => {
        await list(b)
        return (await reads(b, 'refresh')) > refreshes
      })
      t.equal(
        (await b.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })).body,
        await expectedBody(),
        change.split(' ')[0] ?? ''
      )
    }
  }
)

t.test('listener killed: the list comes from the database until the feed is back, then from the cache', async t => {
  await list(a)
  const drops = await metric(a, 'change_feed_drops_total')
  const { rowCount } = await admin.query(
    `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE application_name = $1 AND datname = current_database()`,
    [LISTENER_APPLICATION_NAME]
  )
  t.equal(rowCount, 2, 'one listening connection per instance')
  await until('A notices the drop', async () => (await metric(a, 'change_feed_drops_total')) > drops)
  t.notOk(await listening(a), 'A is not listening')

  const fromDatabase = await metric(a, 'categories_list_reads_total', { source: 'database' })
  const id = await create(b, 'while-disconnected')
  t.ok(
    (await list(a)).some(c => c.id === id),
    'a create on B is visible on A at once'
  )
  t.ok(
    (await metric(a, 'categories_list_reads_total', { source: 'database' })) > fromDatabase,
    'A read the database, not its cache'
  )

  await until('A listens again', async () => await listening(a))
  await until('B listens again', async () => await listening(b))
  const id2 = await create(b, 'after-reconnect')
  await until('a create on B after the reconnect reaches A', async () => (await list(a)).some(c => c.id === id2))
  const cacheReads = await metric(a, 'categories_list_reads_total', { source: 'cache' })
  await list(a)
  await list(a)
  t.ok(
    (await metric(a, 'categories_list_reads_total', { source: 'cache' })) > cacheReads,
    'A serves from its cache again'
  )
})

t.test('the list cache on its own: own rows committed while a build reads the table are in the next read', async t => {
  const writerName = 'petstore/list-cache-test'
  const db = database(t, { applicationName: writerName })
  const registry = new Registry()
  const table = categoriesOf(db)
  // The real table; a test can hold a finished read before it reaches the cache (a build "in flight").
  let hold: { read: () => void; release: Promise<void> } | undefined
  let snapshot: string[] = []
  let rowReads = 0
  const heldTable: ListSource<Category> = {
    name: table.name,
    listJson: async (segmentIds, onSegment) => {
      snapshot = []
      await table.listJson(segmentIds, segment => {
        snapshot.push(...(JSON.parse(`[${segment.bytes.toString()}]`) as Category[]).map(row => row.name))
        onSegment(segment)
      })
      const held = hold
      if (held !== undefined) {
        held.read()
        await held.release
      }
    },
    getMany: async ids => {
      rowReads++
      return await table.getMany(ids)
    },
    page: async (after, limit) => await table.page(after, limit)
  }
  const { cache, feed, close } = categoryListCache(heldTable, {
    connectionString: dbUrl,
    notify: notifyThrough(db),
    log: { warn () {}, info () {} },
    registry
  })
  t.teardown(close)
  await until('the cache listens and has built its list', async () => feed.listening && cache.warmed)
  const names = async (): Promise<string[]> =>
    (JSON.parse(bodyText(await cache.read())) as Array<{ name: string }>).map(c => c.name)

  await t.test('a row committed while a build is in flight is in the next read', async t => {
    cache.invalidate()
    let release = (): void => {}
    const wasRead = new Promise<void>(resolve => {
      hold = {
        read: resolve,
        release: new Promise(resolve => {
          release = resolve
        })
      }
    })
    const reading = cache.read()
    await wasRead // the build has read the table, and not yet handed its list to the cache
    hold = undefined
    cache.created(await table.insertBatch([{ name: 'during rebuild' }]))
    release()
    await reading
    t.notOk(snapshot.includes('during rebuild'), 'the build read the table before the insert')
    t.ok((await names()).includes('during rebuild'), 'the row is added to the built list')
    t.equal(bodyText(await cache.read()), await expectedBody(), "which is the table's")
  })

  await t.test('own rows are added whatever their number: no rebuild', async t => {
    await cache.read()
    const refreshes = await reads(registry, 'refresh')
    const appended = await reads(registry, 'changed')
    cache.created(await table.insertBatch(Array.from({ length: 1500 }, (_, i) => ({ name: `pending ${i}` }))))
    t.ok((await names()).includes('pending 1499'))
    t.equal(await reads(registry, 'changed'), appended + 1, 'changed')
    t.equal(await reads(registry, 'refresh'), refreshes, 'not rebuilt')
    t.equal(bodyText(await cache.read()), await expectedBody(), "the list is the table's")
  })

  await t.test('an own update answered after a newer change of its row was heard is not applied over it', async t => {
    const [row] = await table.insertBatch([{ name: 'version 1' }])
    const id = (row as Category).id
    await until('the cache lists the row', async () => (await names()).includes('version 1'))
    // This instance's UPDATE commits version 2, another's version 3; the answer to ours arrives after both are heard.
    let answer = (_row: Category): void => {}
    const ours = cache.updating(
      id,
      new Promise<Category>(resolve => {
        answer = resolve
      }),
      updated => ({ row: updated, version: '1' })
    )
    await admin.query("UPDATE categories SET name = 'version 2' WHERE id = $1", [String(id)])
    await admin.query("UPDATE categories SET name = 'version 3' WHERE id = $1", [String(id)])
    // Notified after both updates (commit order): once it is listed, both were heard.
    await admin.query("INSERT INTO categories (name) VALUES ('after version 3')")
    await until('the cache heard both updates', async () => (await names()).includes('after version 3'))
    t.ok((await names()).includes('version 1'), "while this instance's update is under way, its row waits for it")
    answer({ id, name: 'version 2' })
    await ours
    t.ok((await names()).includes('version 3'), 'version 3 stays')
    t.notOk((await names()).includes('version 2'), 'the older answer was read again, not applied')
    t.equal(bodyText(await cache.read()), await expectedBody(), "the list is the table's")
  })

  await t.test('own updates that must each read their row again, answered together, read it in one query', async t => {
    const [row] = await table.insertBatch([{ name: 'busy 1' }])
    const id = (row as Category).id
    await until('the cache lists the row', async () => (await names()).includes('busy 1'))
    // Each of these updates hears another version of its row while under way, so each must read the row again.
    const answers: Array<() => void> = []
    const updates = Array.from({ length: BUSY_ROW_UPDATES }, async () => {
      const write = new Promise<Category>(resolve => {
        answers.push(() => {
          resolve({ id, name: 'an older version' })
        })
      })
      return await cache.updating(id, write, updated => ({ row: updated, version: '1' }))
    })
    await admin.query("UPDATE categories SET name = 'busy 2' WHERE id = $1", [String(id)])
    await admin.query("INSERT INTO categories (name) VALUES ('after busy 2')")
    await until('the cache heard the update', async () => (await names()).includes('after busy 2'))
    const before = rowReads
    for (const answer of answers) answer()
    await Promise.all(updates)
    t.ok((await names()).includes('busy 2'), 'the version read again is listed')
    t.equal(rowReads - before, 1, `${BUSY_ROW_UPDATES} rereads of one row, queued together, are one query`)
    t.equal(bodyText(await cache.read()), await expectedBody(), "the list is the table's")
  })
})

t.test(
  'a feed that cannot prove it hears never serves from the cache, warns once naming the setting to fix, ' +
    'and then tries less often',
  async t => {
    const db = database(t, { max: 2 })
    const repository = categoriesOf(db)
    // As behind a transaction pooler: LISTEN succeeds, and what the pool notifies never arrives (here: it goes to
    // another channel).
    const deaf = async (_channel: string, payload: string): Promise<void> => {
      await db.query('SELECT pg_notify($1, $2)', ['elsewhere', payload])
    }
    // And a pool that cannot send at all.
    const mute = async (): Promise<void> => {
      throw new Error('the pool is gone')
    }
    const cases = [
      {
        label: 'deaf',
        notify: deaf,
        warnings: [
          /did not hear its own notification within 150 ms.*set DATABASE_DIRECT_URL/,
          /heard nothing on 3 connections in a row; it tries again less often/
        ]
      },
      { label: 'mute', notify: mute, warnings: [/could not send its probe notification/] }
    ]
    for (const { label, notify, warnings: expected } of cases) {
      const warnings: Array<{ msg: string; retryInMs?: number }> = []
      const registry = new Registry()
      const { cache, feed, close } = categoryListCache(repository, {
        connectionString: dbUrl,
        notify,
        registry,
        probeTimeoutMs: 150,
        minBackoffMs: 20,
        maxBackoffMs: 50,
        deafRetryMs: 400,
        log: {
          warn (obj: { retryInMs?: number }, msg: string) {
            warnings.push({ msg, retryInMs: obj.retryInMs })
          },
          info () {}
        }
      })
      t.teardown(close)
      await until(
        `the ${label} feed has missed five probes`,
        async () => (await metric(registry, 'change_feed_probes_missed_total')) >= 5
      )
      t.notOk(feed.listening, `${label}: the feed does not claim to hear`)
      t.equal(await metric(registry, 'change_feed_listening'), 0)
      const id = (await repository.insertBatch([{ name: `written while ${label}` }]))[0]?.id
      for (let i = 0; i < 3; i++) {
        t.ok(
          JSON.parse(bodyText(await cache.read())).some((c: { id: number }) => BigInt(c.id) === id),
          `${label}: every read has the new row`
        )
      }
      t.equal(await reads(registry, 'database'), 3, `${label}: all three reads went to the database`)
      t.equal(await reads(registry, 'cache'), 0)
      t.equal(warnings.length, expected.length, `${label}: ${expected.length} warning(s), not one per probe`)
      expected.forEach((pattern, i) => {
        t.match(warnings[i]?.msg, pattern)
      })
      if (label === 'deaf') {
        t.equal(warnings[1]?.retryInMs, 400, 'after three deaf connections the feed waits deafRetryMs between tries')
      }
      t.equal(
        await metric(registry, 'change_feed_connection_info', { connection: 'DATABASE_URL' }),
        1,
        'the metrics say which connection the feed uses'
      )
    }
  }
)

t.test(
  "a busy pool is not a deaf feed: the probe takes no request's place in the wait queue, " +
    'and waiting for a connection is not missing an echo',
  async t => {
    // One connection, one place in the queue: the probe must neither take that place from a request nor count its wait
    // against its echo.
    const pool = database(t, { max: 1, maxWaiting: 1, connectionTimeoutMs: 5000 })
    const registry = new Registry()
    const warnings: string[] = []
    const { cache, feed, close } = categoryListCache(categoriesOf(pool), {
      connectionString: db.url,
      notify: notifyThrough(pool),
      registry,
      probeIntervalMs: 50,
      probeTimeoutMs: 150,
      log: {
        warn (_obj: unknown, msg: string) {
          warnings.push(msg)
        },
        info () {}
      }
    })
    t.teardown(close)
    await until('the feed hears', async () => feed.listening)
    // Hearing starts the list's build on the pool's one connection: the test takes it only after the build.
    await cache.warm()
    let release = (): void => {}
    let holding = (): void => {}
    const holds = new Promise<void>(resolve => {
      holding = resolve
    })
    const held = pool.withClient(async () => {
      holding()
      await new Promise<void>(resolve => {
        release = resolve
      })
    })
    try {
      await holds
      await sleep(120) // a probe fell due meanwhile and waits for the pool's one connection
      const queued = pool.query<{ one: number }>('SELECT 1 AS one')
      await t.rejects(
        pool.query('SELECT 2'),
        { reason: POOL_QUEUE_FULL } as unknown as Error,
        'a second request is refused at once: the bound holds for requests'
      )
      await sleep(500) // more than three probe timeouts
      t.ok(feed.listening, 'the feed still counts as hearing while its probe waits for a connection')
      release()
      t.equal((await queued).rows[0]?.one, 1, 'the queued request is served')
    } finally {
      release()
      await held
    }
    await sleep(300) // the waiting probe and later ones are heard
    t.ok(feed.listening, 'the feed hears')
    t.equal(await metric(registry, 'change_feed_drops_total'), 0, 'the feed was never dropped')
    t.equal(await metric(registry, 'change_feed_probes_missed_total'), 0, 'no probe counted as missed')
    t.same(warnings, [], 'nothing warned')
  }
)

t.test('a list longer than one chunk (1000 rows) is read in chunks and comes out byte for byte the same', async t => {
  await admin.query(`INSERT INTO categories (name, description)
    SELECT 'bulk ' || i || ' "' || chr(233) || '"', CASE WHEN i % 3 = 0 THEN 'tab' || chr(9) || i END
    FROM generate_series(1, 2500) AS i`)
  const total = Number((await admin.query<{ n: string }>('SELECT count(*) AS n FROM categories')).rows[0]?.n)
  await until('A lists every row', async () => (await list(a)).length === total)
  const res = await a.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  t.equal(res.body, await expectedBody())
  t.equal(res.headers.etag, await expectedTag())

  const id = await create(a, 'after the long list')
  const after = await a.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  t.ok(
    after.body.endsWith(`,${categoryJson({ id: String(id), name: 'after the long list' })}]`),
    'an own create is added to the long list'
  )
  t.equal(after.body, await expectedBody())

  // Built into a buffer sized for the long list: the short one must come out exact.
  await admin.query("DELETE FROM categories WHERE name LIKE 'bulk %'")
  await until('A lists the short list', async () => (await list(a)).length === total + 1 - 2500)
  const short = await a.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  t.equal(short.body, await expectedBody(), 'a list that shrank')
  t.equal(short.headers.etag, await expectedTag())
})

t.test('a list over a megabyte is sent whole, as its parts, with its length and tag', async t => {
  await admin.query(
    "INSERT INTO categories (name) SELECT 'long list ' || repeat('x', 90) || i FROM generate_series(1, 15000) AS i"
  )
  const expected = await expectedBody()
  t.ok(Buffer.byteLength(expected) > 1024 * 1024, 'the list is over a megabyte')
  await until(
    'A lists every row',
    async () => (await a.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })).body === expected
  )
  const res = await a.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  t.equal(res.statusCode, 200)
  t.equal(res.headers['content-length'], String(Buffer.byteLength(expected)))
  t.equal(res.body, expected)
  t.equal(res.headers.etag, await expectedTag())
  await admin.query("DELETE FROM categories WHERE name LIKE 'long list %'")
})
