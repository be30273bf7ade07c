import { setTimeout as sleep } from 'node:timers/promises'
import type { LightMyRequestResponse } from 'fastify'
import pg from 'pg'
import t, { type Test } from 'tap'
import { AUTH, metric, testApp, until } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { lockCategories, lockWaiter } from '../helpers/pg-client.js'
import { TcpProxy, type ProxiedConnection } from '../helpers/tcp-proxy.js'
import { registerWidgets, widgetsMigration } from '../widgets/setup.js'
import { runMigrations } from '../../src/db/migrate.js'

/*
 * Connections lost while a request holds one: a backend terminated by the
 * server (pg_terminate_backend, as a failover or an operator does), and a
 * connection cut by the network. Each must be a 503 for that request, never
 * an exit, and the Idempotency-Key must then answer its retry correctly.
 * The service reaches PostgreSQL through a TCP proxy this file controls.
 */

const db = await testDatabase(t)
const dbUrl = new URL(db.url)
const proxy = await TcpProxy.start({ host: dbUrl.hostname, port: Number(dbUrl.port || 5432) })
t.teardown(async () => {
  await proxy.close()
})
const admin = new pg.Client({ connectionString: db.url })
await admin.connect()
t.teardown(async () => {
  await admin.end()
})
// Two resources, as a service grows to: a fault must hit the request that holds it, whichever list is being built.
await runMigrations(db.url, { info () {}, warn () {}, error () {} })
await admin.query(widgetsMigration)
const { app } = await testApp(t, proxy.url(db.url), {}, { register: registerWidgets })

async function create (name: string, key: string): Promise<LightMyRequestResponse> {
  return await app.inject({
    method: 'POST',
    url: '/v1/categories',
    headers: { ...AUTH, 'content-type': 'application/json', 'idempotency-key': key },
    payload: JSON.stringify({ name })
  })
}

async function rowsNamed (name: string): Promise<Array<{ id: string }>> {
  return (await admin.query<{ id: string }>('SELECT id::text FROM categories WHERE name = $1', [name])).rows
}

/** Past the change feed's longest backoff (5 s, jitter up to 1.25 ×) and a connection's time limit (2 s). */
const FEED_BACKOFF_BUDGET_MS = 30_000

/** Rows whose ids, comma-separated, pass the 7,900 characters an insert's notification may carry. */
const UNANNOUNCED_INSERT_ROWS = 3000

/** The service's backend that waits for a lock (its INSERT behind the blocker's table lock). */
const lockWaiterPid = async (): Promise<number> =>
  await until('a backend waits for the table lock', async () => await lockWaiter(admin))

const ended = async (pid: number | undefined): Promise<boolean> =>
  (await admin.query('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [pid])).rowCount === 0

function expectUnavailable (t: Test, res: LightMyRequestResponse): void {
  t.equal(res.statusCode, 503, res.body)
  t.same(res.json(), { code: 'SERVICE_UNAVAILABLE', message: res.json().message, status: 503 })
  t.match(String(res.headers['retry-after']), /^\d+$/, 'Retry-After')
}

async function stillServing (t: Test): Promise<void> {
  t.equal((await app.inject({ method: 'GET', url: '/health/ready' })).statusCode, 200, 'the process lives and is ready')
}

t.test(
  'a backend terminated while an idempotent create holds its connection: 503, and the retry creates the row once',
  async t => {
    const blocker = await lockCategories(t, db.url, 'EXCLUSIVE')
    const pending = create('terminated mid-create', 'lost-1')
    const pid = await lockWaiterPid()
    await admin.query('SELECT pg_terminate_backend($1)', [pid])
    expectUnavailable(t, await pending)
    await blocker.query('ROLLBACK')
    const retry = await create('terminated mid-create', 'lost-1')
    t.equal(retry.statusCode, 201, retry.body)
    t.equal(retry.headers['idempotent-replayed'], undefined, 'a fresh attempt: nothing had committed')
    t.same(
      (await rowsNamed('terminated mid-create')).map(r => r.id),
      [String(retry.json().id)],
      'exactly one row'
    )
    await stillServing(t)
  }
)

t.test(
  'the connection lost after its COMMIT reached the server: 503, and the retry replays the committed answer',
  async t => {
    let cut = false
    proxy.onClientData = (chunk: Buffer, connection: ProxiedConnection) => {
      if (cut || !chunk.includes('COMMIT')) return false
      cut = true
      // The server gets the COMMIT (then the end of the stream); the service never hears the answer.
      connection.server.end(chunk)
      connection.client.destroy()
      return true
    }
    t.teardown(() => {
      proxy.onClientData = undefined
    })
    expectUnavailable(t, await create('lost after commit', 'lost-2'))
    t.ok(cut, 'the connection was cut after the COMMIT')
    const [row] = await until('the committed row', async () => {
      const rows = await rowsNamed('lost after commit')
      return rows.length > 0 ? rows : undefined
    })
    const retry = await create('lost after commit', 'lost-2')
    t.equal(retry.statusCode, 201, retry.body)
    t.equal(retry.headers['idempotent-replayed'], 'true', 'the committed answer, replayed')
    t.equal(String(retry.json().id), row?.id, 'with the id that was committed')
    t.equal((await rowsNamed('lost after commit')).length, 1, 'no second row')
    await stillServing(t)
  }
)

t.test('the database unreachable when a request fails and back for its retry: the key is not stuck', async t => {
  const blocker = await lockCategories(t, db.url, 'EXCLUSIVE')
  const pending = create('outage mid-create', 'lost-3')
  const orphan = await lockWaiterPid()
  proxy.down()
  t.teardown(() => {
    proxy.restore()
  })
  expectUnavailable(t, await pending)
  await sleep(100)
  proxy.restore()
  await blocker.query('ROLLBACK')
  // PostgreSQL finds the first attempt's client gone only once its INSERT gets the lock and answers; until then that
  // backend holds the key (a retry meanwhile gets 409 with Retry-After, as any request under way). Then it is free.
  await until('the first attempt\'s backend ended', async () => await ended(orphan))
  const retry = await create('outage mid-create', 'lost-3')
  t.equal(retry.statusCode, 201, `the retry is answered at once, not 409 until a lock lapses: ${retry.body}`)
  t.equal(retry.headers['idempotent-replayed'], undefined)
  t.equal((await rowsNamed('outage mid-create')).length, 1)
  await stillServing(t)
})

t.test('a backend terminated during a long list read (the COPY path): 503, then the whole list', async t => {
  // The outage above dropped the change feed; deaf, an instance reads lists without COPY. Once it hears again (its
  // backoff may have grown to seconds), an insert too large to announce its ids ('*') drops the list everywhere, so
  // the next read builds the whole list through COPY.
  await until(
    'the change feed listening again',
    async () => (await metric(app, 'change_feed_listening')) === 1,
    FEED_BACKOFF_BUDGET_MS
  )
  await admin.query('INSERT INTO categories (name) SELECT $1 || i FROM generate_series(1, $2::int) AS i', [
    'bulk ',
    UNANNOUNCED_INSERT_ROWS
  ])
  let release: (() => void) | undefined
  // Every resource's list is built again once the feed hears: the COPY held is this list's, and the backend ended
  // is the one behind the held connection (PostgreSQL sees the proxy's side of it as the client's port).
  const held = new Promise<number>(resolve => {
    proxy.onClientData = (chunk: Buffer, connection: ProxiedConnection) => {
      if (release !== undefined || !chunk.includes('COPY (SELECT') || !chunk.includes('FROM categories ')) return false
      release = () => {
        connection.server.write(chunk)
      }
      resolve(connection.server.localPort ?? 0)
      return true
    }
  })
  t.teardown(() => {
    proxy.onClientData = undefined
  })
  const list = until('a list read from the database', async () => {
    const res = await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
    return release === undefined && res.statusCode === 200 ? undefined : res
  })
  const clientPort = await held
  const { rows } = await admin.query<{ pid: number }>(
    "SELECT pid FROM pg_stat_activity WHERE client_port = $1 AND query LIKE 'BEGIN ISOLATION LEVEL REPEATABLE READ%'",
    [clientPort]
  )
  t.equal(rows.length, 1, 'the backend of the held COPY holds the snapshot')
  await admin.query('SELECT pg_terminate_backend($1)', [rows[0]?.pid])
  await until('the terminated backend ended', async () => await ended(rows[0]?.pid))
  release?.()
  expectUnavailable(t, await list)
  proxy.onClientData = undefined
  const {
    rows: [count]
  } = await admin.query<{ n: number }>('SELECT count(*)::int AS n FROM categories')
  const after = await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  t.equal(after.statusCode, 200)
  t.equal((after.json() as unknown[]).length, count?.n, 'the whole list')
  await stillServing(t)
})

t.test('every key of this file answers as it should afterwards', async t => {
  for (const [name, key] of [
    ['terminated mid-create', 'lost-1'],
    ['lost after commit', 'lost-2'],
    ['outage mid-create', 'lost-3']
  ] as const) {
    const res = await create(name, key)
    t.equal(res.statusCode, 201)
    t.equal(res.headers['idempotent-replayed'], 'true', `${key} replays`)
  }
})
