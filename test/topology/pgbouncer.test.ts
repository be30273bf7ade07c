import { setTimeout as sleep } from 'node:timers/promises'
import { PG_MIGRATE_LOCK_ID } from 'node-pg-migrate'
import pg from 'pg'
import t, { type Test } from 'tap'
import { AUTH, testApp, until } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { lockCategories, withClient } from '../helpers/pg-client.js'
import { startInstances, waitReady, type Instance, type InstanceOptions, type Instances } from './helpers/instances.js'
import { auditLoad, startLoad, tableRows } from './helpers/load.js'
import { ensurePgBouncer, startPgBouncer, type PgBouncer, type PoolMode } from './helpers/pgbouncer.js'

/*
 * The service behind a real PgBouncer 1.18 with its stock settings, in session and
 * in transaction pooling: the statement timeout still enforced by the server, every
 * statement working on whichever server connection the pooler hands out, two
 * instances under the topology tests' create/list load and audit (helpers/load.ts),
 * a create on one
 * instance in the other's list within 100 ms (from the cache when the change feed
 * can prove it hears, from the database when it cannot), and three instances
 * starting together on a fresh database.
 */

const API_KEY = 'pgbouncer-test-key'
const CONSISTENCY_MS = 100
/** An update or delete on one instance is in every other's list within a second (docs/api.md). */
const FOLLOW_MS = 1000
/** How long a change past its bound is still looked for, so that a failure says how late it was. */
const LATE_LOOK_MS = 1000
/** Creates the load makes before its audit, however long a busy machine takes for them. */
const LOAD_CREATES = 50
const LOAD_CREATES_WAIT_MS = 60_000
const LOAD_POLL_MS = 50

t.comment(ensurePgBouncer())
const db = await testDatabase(t)
t.comment(`PostgreSQL from ${db.source}`)

// ---------- instances: the real process, as production runs it (helpers/instances.ts), with metrics on ----------

async function instancesOn (
  t: Test,
  databaseUrl: string,
  options: Pick<InstanceOptions, 'count' | 'label' | 'waitReady' | 'oneByOne' | 'env'>
): Promise<Instances> {
  return await startInstances(t, { ...options, databaseUrl, apiKey: API_KEY, metrics: true })
}

async function metric (instance: Instance, name: string, labels = ''): Promise<number> {
  const text = await (await fetch(instance.metricsUrl ?? '')).text()
  const line = text
    .split('\n')
    .find(l => l.startsWith(`${name}${labels} `) || (labels === '' && l.startsWith(`${name}{`)))
  return line === undefined ? 0 : Number(line.split(' ').pop())
}

/** The migration lock (node-pg-migrate's key), held by the test on a direct connection until `waiters` others wait for
 * it. */
async function holdMigrationLock (
  url: string
): Promise<{ releaseOnceWaiting: (waiters: number, timeoutMs: number) => Promise<number> }> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  await client.query('SELECT pg_advisory_lock($1)', [String(PG_MIGRATE_LOCK_ID)])
  return {
    releaseOnceWaiting: async (waiters, timeoutMs) => {
      const deadline = Date.now() + timeoutMs
      let waiting = 0
      try {
        while (waiting < waiters && Date.now() < deadline) {
          await sleep(50)
          const { rows } = await client.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_locks
            WHERE locktype = 'advisory' AND NOT granted
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
          waiting = rows[0]?.n ?? 0
        }
      } finally {
        await client.end() // releases the lock
      }
      return waiting
    }
  }
}

/** `count` clients running short queries on the database until stopped; resolves to how many they ran. */
function otherClients (url: string, count: number): { stop: () => Promise<number> } {
  const state = { running: true }
  let queries = 0
  const clients = Array.from({ length: count }, async () => {
    const client = new pg.Client({ connectionString: url })
    client.on('error', () => {})
    try {
      await client.connect()
      while (state.running) {
        await client.query('SELECT pg_sleep(0.002)').then(
          () => {
            queries++
          },
          async () => {
            await sleep(50)
          }
        )
      }
    } catch {
      // The database may not accept connections yet in the first milliseconds: the others carry on.
    } finally {
      await client.end().catch(() => {})
    }
  })
  return {
    stop: async () => {
      state.running = false
      await Promise.all(clients)
      return queries
    }
  }
}

// ---------- load and audit (helpers/load.ts), and the cross-instance rule ----------

/** A load of creates (most with an Idempotency-Key) and lists over the instances for `ms`, and until it has made
 * LOAD_CREATES (a busy machine makes fewer), then the audit; the instances keep running. */
async function loadAndAudit (t: Test, instances: Instances, databaseUrl: string, ms: number): Promise<void> {
  const before = await tableRows(databaseUrl)
  const load = startLoad(t, { targets: instances.urls, apiKey: API_KEY, consistencyMs: CONSISTENCY_MS })
  await sleep(ms)
  await until(`the load made ${LOAD_CREATES} creates`, async () => load.acknowledgedCount() >= LOAD_CREATES,
    LOAD_CREATES_WAIT_MS, LOAD_POLL_MS)
  const figures = await auditLoad(t, await load.stop(), { databaseUrl, instances, before, stopInstances: false })
  t.comment(`figures: ${JSON.stringify(figures)}`)
}

async function send (
  base: string,
  method: 'GET' | 'POST' | 'PATCH' | 'DELETE',
  body?: unknown,
  id = ''
): Promise<{ status: number; body: string }> {
  const res = await fetch(`${base}/v1/categories${id === '' ? '' : `/${id}`}`, {
    method,
    headers: {
      authorization: `Bearer ${API_KEY}`,
      ...(body === undefined ? {} : { 'content-type': 'application/json' })
    },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(15000)
  })
  return { status: res.status, body: await res.text() }
}

async function stopAll (t: Test, instances: Instances): Promise<void> {
  for (const stopped of await instances.stop()) t.equal(stopped.code, 0, `${stopped.name} exits 0 on SIGTERM`)
}

/** A create on `from` must be in `to`'s list within CONSISTENCY_MS, every time. */
async function crossInstanceProbe (t: Test, from: Instance, to: Instance, rounds = 10): Promise<void> {
  for (let i = 0; i < rounds; i++) {
    await send(to.url, 'GET') // `to` holds whatever it caches
    const answer = await send(from.url, 'POST', { name: `probe-${Date.now()}-${i}` })
    t.equal(answer.status, 201)
    const { id, name } = JSON.parse(answer.body) as { id: number, name: string }
    const look = await firstListed(to, String(id), name, performance.now(), CONSISTENCY_MS + LATE_LOOK_MS)
    t.ok(
      keptWithin(look, CONSISTENCY_MS),
      `create ${i} on ${from.name} is in ${to.name}'s lists from ${CONSISTENCY_MS} ms after the 201: ${told(look)}`
    )
  }
}

/** Whether `to`'s list shows the category with this id by this name (undefined: not at all). */
async function listed (to: Instance, id: string, name: string | undefined): Promise<boolean> {
  const list = await send(to.url, 'GET')
  if (list.status !== 200) return false
  const found = (JSON.parse(list.body) as Array<{ id: number; name: string }>).find(c => String(c.id) === id)
  return found?.name === name
}

/** When (ms after the change) the last list that missed it was asked for, and the first that showed it. */
interface Look { lastMissed: number | undefined, firstShown: number | undefined }

/** Lists of `to` asked for one after another from `since`, until one shows the row so or `lookMs` have passed. */
async function firstListed (to: Instance, id: string, name: string | undefined, since: number, lookMs: number):
Promise<Look> {
  let lastMissed: number | undefined
  while (performance.now() - since <= lookMs) {
    const askedAt = performance.now() - since
    if (await listed(to, id, name)) return { lastMissed, firstShown: askedAt }
    lastMissed = askedAt
    await sleep(2)
  }
  return { lastMissed, firstShown: undefined }
}

/**
 * The rule is that every list asked for `withinMs` or more after the change shows it: broken by a list asked for
 * then that missed it, not by a slow answer to one asked for earlier (a busy machine answers lists late).
 */
const keptWithin = (look: Look, withinMs: number): boolean =>
  look.firstShown !== undefined && (look.lastMissed ?? 0) < withinMs

function told ({ lastMissed, firstShown }: Look): string {
  const missed = lastMissed === undefined ? 'no list missed it' : `the last to miss it was asked at ${ms(lastMissed)}`
  const shown = firstShown === undefined ? 'none showed it' : `the first to show it at ${ms(firstShown)}`
  return `${missed}, ${shown}`
}

const ms = (value: number): string => `${value.toFixed(1)} ms`

/** An update and a delete on `from`: in its own next list at once, in `to`'s within FOLLOW_MS. */
async function crossInstanceChangeProbe (t: Test, from: Instance, to: Instance, rounds = 3): Promise<void> {
  for (let i = 0; i < rounds; i++) {
    const created = await send(from.url, 'POST', { name: `to change ${i}` })
    const id = String((JSON.parse(created.body) as { id: number }).id)
    for (const [method, name] of [
      ['PATCH', `changed ${i}`],
      ['DELETE', undefined]
    ] as const) {
      await send(to.url, 'GET') // `to` holds whatever it caches
      const answer = await send(from.url, method, method === 'PATCH' ? { name } : undefined, id)
      t.equal(answer.status, method === 'PATCH' ? 200 : 204, `${method} ${i}`)
      const answeredAt = performance.now()
      t.ok(await listed(from, id, name), `${method} ${i} on ${from.name} is in its own next list`)
      const look = await firstListed(to, id, name, answeredAt, FOLLOW_MS + LATE_LOOK_MS)
      t.ok(
        keptWithin(look, FOLLOW_MS),
        `${method} ${i} on ${from.name} is in ${to.name}'s lists from ${FOLLOW_MS} ms after it: ${told(look)}`
      )
    }
  }
}

// ---------- the tests ----------

for (const mode of ['transaction', 'session'] as PoolMode[]) {
  t.test(`PgBouncer, ${mode} pooling`, async t => {
    const bouncer: PgBouncer = await startPgBouncer(t, db.url, mode)

    t.test('a statement over DB_STATEMENT_TIMEOUT_MS is a 503 (the server cancels it), not a hang', async t => {
      const url = await db.createDatabase()
      const { app } = await testApp(t, bouncer.urlFor(url), { DB_STATEMENT_TIMEOUT_MS: '300' })
      const created = await app.inject({
        method: 'POST',
        url: '/v1/categories',
        headers: { ...AUTH, 'content-type': 'application/json' },
        payload: '{"name":"before the lock"}'
      })
      t.equal(created.statusCode, 201, created.body)
      const locker = await lockCategories(t, url, 'ACCESS EXCLUSIVE')
      for (const request of [
        {
          method: 'POST' as const,
          url: '/v1/categories',
          headers: { ...AUTH, 'content-type': 'application/json' },
          payload: '{"name":"behind the lock"}'
        },
        { method: 'GET' as const, url: '/v1/categories/1', headers: AUTH }
      ]) {
        const started = performance.now()
        const res = await app.inject(request)
        const ms = performance.now() - started
        t.equal(res.statusCode, 503, `${request.method} ${request.url}`)
        t.equal(res.json().code, 'SERVICE_UNAVAILABLE')
        t.ok(ms < 3000, `answered in ${Math.round(ms)} ms`)
      }
      const { rows } = await locker.query<{ query: string }>(
        "SELECT query FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
      )
      t.same(
        rows,
        [],
        'no statement still waits for the lock on the server: it was canceled there, not abandoned by the client'
      )
      await locker.query('ROLLBACK')
      const list = (await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })).json() as Array<{
        name: string
      }>
      t.same(
        list.map(c => c.name),
        ['before the lock'],
        'the timed-out create left no row'
      )
    })

    t.test('every statement works on whichever server connection the pooler hands out', async t => {
      const url = await db.createDatabase()
      const { app } = await testApp(t, bouncer.urlFor(url))
      const statuses = new Map<string, number>()
      const failures: string[] = []
      await Promise.all(
        Array.from({ length: 20 }, async (_, client) => {
          for (let i = 0; i < 15; i++) {
            const name = `statement-${client}-${i}`
            const requests = [
              {
                method: 'POST' as const,
                url: '/v1/categories',
                headers: { ...AUTH, 'content-type': 'application/json' },
                payload: JSON.stringify({ name })
              },
              {
                method: 'POST' as const,
                url: '/v1/categories',
                headers: { ...AUTH, 'content-type': 'application/json', 'idempotency-key': name },
                payload: JSON.stringify({ name: `${name} keyed` })
              },
              { method: 'GET' as const, url: '/v1/categories', headers: AUTH },
              { method: 'GET' as const, url: `/v1/categories/${1 + i}`, headers: AUTH }
            ]
            const request = requests[(client + i) % requests.length] as (typeof requests)[number]
            const res = await app.inject(request)
            const key = `${request.method} ${request.url.replace(/\d+$/, ':id')} ${res.statusCode}`
            statuses.set(key, (statuses.get(key) ?? 0) + 1)
            if (res.statusCode >= 500) failures.push(`${key}: ${res.body}`)
          }
        })
      )
      t.comment(JSON.stringify(Object.fromEntries(statuses)))
      t.same(failures.slice(0, 5), [], 'no 5xx among 300 requests over 20 concurrent clients')
    })

    t.test(
      'two instances under create/list load, with and without Idempotency-Key: ' +
        'nothing lost, nothing invented, no 500, nobody exits',
      async t => {
        const url = await db.createDatabase()
        // One after the other: starting together is the next test's subject.
        const both = await instancesOn(t, bouncer.urlFor(url), { count: 2, label: mode, oneByOne: true })
        await loadAndAudit(t, both, url, 6000)
        await t.test(
          `a create on one instance is in the other's list within ${CONSISTENCY_MS} ms, an update or delete ` +
            `within ${FOLLOW_MS} ms`,
          async t => {
            const [a, b] = both.list as [Instance, Instance]
            await crossInstanceProbe(t, a, b)
            await crossInstanceChangeProbe(t, a, b)
            const reads = async (source: string): Promise<number> =>
              await metric(b, 'categories_list_reads_total', `{source="${source}"}`)
            t.comment(
              `B's list reads: ${JSON.stringify({ cache: await reads('cache'), database: await reads('database') })}`
            )
            if (mode === 'transaction') {
              // LISTEN through a transaction pooler hears nothing: the feed must know it, and say so.
              t.equal(await metric(b, 'change_feed_listening'), 0, "B's feed does not claim to hear")
              t.ok((await metric(b, 'change_feed_probes_missed_total')) > 0, 'its probes went unheard')
              t.ok((await reads('database')) > 0, 'B reads the list from the database')
              t.match(
                both.log(b),
                /did not hear its own notification.*set DATABASE_DIRECT_URL/,
                'and its log names the setting that fixes it'
              )
            } else {
              // A session pooler keeps the listening connection's session: LISTEN works.
              t.equal(await metric(b, 'change_feed_listening'), 1, "B's feed hears")
              t.ok((await reads('cache')) > 0, 'B serves the list from its cache')
            }
          }
        )
        await stopAll(t, both)
      }
    )

    t.test('three instances starting together on a fresh database through the pooler, three times', async t => {
      for (let round = 1; round <= 3; round++) {
        const url = await db.createDatabase()
        // Rounds 1 and 2 make sure the three really meet: the test holds the migration lock (as a fourth instance
        // would) until all three wait for it. Round 3 lets them start as they come.
        const gate = round < 3 ? await holdMigrationLock(url) : undefined
        // Other clients of the database (the old version of a rolling deploy, say) keep the pooler's server connections
        // busy.
        const others = otherClients(bouncer.urlFor(url), 4)
        const instances = await instancesOn(t, bouncer.urlFor(url), {
          count: 3,
          label: `${mode} round ${round}`,
          waitReady: false
        })
        if (gate !== undefined) {
          const waiting = await gate.releaseOnceWaiting(3, 30000)
          t.equal(waiting, 3, `round ${round}: all three instances waited for the migration lock at once`)
        }
        const started = performance.now()
        const outcomes = await Promise.allSettled(
          instances.list.map(async instance => {
            await waitReady(instance, 30000)
          })
        )
        const after = gate === undefined ? 'starting' : 'the lock was released'
        t.comment(`round ${round}: all ready ${Math.round(performance.now() - started)} ms after ${after}`)
        t.comment(`round ${round}: other clients ran ${await others.stop()} queries meanwhile`)
        t.same(
          outcomes
            .filter(o => o.status === 'rejected')
            .map(o => String((o as PromiseRejectedResult).reason).slice(0, 1500)),
          [],
          `round ${round}: all three ready`
        )
        const { rows } = await withClient(
          url,
          async c =>
            await c.query<{ total: number; names: number }>(
              'SELECT count(*)::int AS total, count(DISTINCT name)::int AS names FROM pgmigrations'
            )
        )
        t.same(
          rows[0],
          { total: rows[0]?.names, names: rows[0]?.names },
          `round ${round}: each migration recorded once (${rows[0]?.names ?? 0} migrations)`
        )
        const locks = await withClient(
          url,
          async c =>
            await c.query(`SELECT pid FROM pg_locks WHERE locktype = 'advisory'
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
        )
        t.equal(locks.rowCount, 0, `round ${round}: no advisory lock is left held`)
        await stopAll(t, instances)
      }
    })
  })
}

t.test(
  'transaction pooling with DATABASE_DIRECT_URL: the change feed listens directly, hears, ' +
    'and the cache keeps the 100 ms rule',
  async t => {
    const bouncer = await startPgBouncer(t, db.url, 'transaction')
    const url = await db.createDatabase()
    const instances = await instancesOn(t, bouncer.urlFor(url), {
      count: 2,
      label: 'direct',
      env: { DATABASE_DIRECT_URL: url }
    })
    const [a, b] = instances.list as [Instance, Instance]
    for (const instance of instances.list) {
      const deadline = Date.now() + 10000
      while ((await metric(instance, 'change_feed_listening')) !== 1 && Date.now() < deadline) await sleep(50)
      t.equal(await metric(instance, 'change_feed_listening'), 1, `${instance.name}'s feed hears`)
      t.equal(
        await metric(instance, 'change_feed_connection_info', '{connection="DATABASE_DIRECT_URL"}'),
        1,
        'on DATABASE_DIRECT_URL'
      )
      t.comment(
        `${instance.name}: probe echo ${((await metric(instance, 'change_feed_echo_seconds')) * 1000).toFixed(1)} ms`
      )
    }
    await loadAndAudit(t, instances, url, 4000)
    const cacheReads = await metric(b, 'categories_list_reads_total', '{source="cache"}')
    await crossInstanceProbe(t, a, b)
    await crossInstanceProbe(t, b, a)
    await crossInstanceChangeProbe(t, a, b)
    await crossInstanceChangeProbe(t, b, a)
    t.ok(
      (await metric(b, 'categories_list_reads_total', '{source="cache"}')) > cacheReads,
      'B served lists from its cache'
    )
    await stopAll(t, instances)
  }
)
