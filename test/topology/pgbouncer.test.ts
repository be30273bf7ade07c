import { spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { setTimeout as sleep } from 'node:timers/promises'
import { PG_MIGRATE_LOCK_ID } from 'node-pg-migrate'
import pg from 'pg'
import t, { type Test } from 'tap'
import { freePort } from '../helpers/ports.js'
import { AUTH, testApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { withClient } from '../helpers/pg-client.js'
import { ensurePgBouncer, startPgBouncer, type PgBouncer, type PoolMode } from './helpers/pgbouncer.js'

/*
 * The service behind a real PgBouncer 1.18 with its stock settings, in session and
 * in transaction pooling: the statement timeout still enforced by the server, every
 * statement working on whichever server connection the pooler hands out, two
 * instances under create/list load with an audit at the end, a create on one
 * instance in the other's list within 100 ms (from the cache when the change feed
 * can prove it hears, from the database when it cannot), and three instances
 * starting together on a fresh database.
 */

const API_KEY = 'pgbouncer-test-key'
const ERROR_KEYS = ['code', 'message', 'status']
const CONSISTENCY_MS = 100

t.comment(ensurePgBouncer())
const db = await testDatabase(t)
t.comment(`PostgreSQL from ${db.source}`)

// ---------- instances: the real process, as production runs it ----------

interface Instance {
  name: string
  base: string
  metricsPort: number
  child: ChildProcess
  output: () => string
  exited: Promise<{ code: number | null, signal: string | null }>
  /** SIGTERM and the exit code (0 is a clean shutdown). */
  stop: () => Promise<number | null>
}

async function startInstance (t: Test, name: string, env: Record<string, string>): Promise<Instance> {
  const port = await freePort()
  const metricsPort = await freePort()
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
    env: {
      PATH: process.env.PATH ?? '',
      HOME: process.env.HOME ?? '/tmp',
      NODE_ENV: 'production',
      HOST: '127.0.0.1',
      PORT: String(port),
      METRICS_HOST: '127.0.0.1',
      METRICS_PORT: String(metricsPort),
      API_KEYS: API_KEY,
      SHUTDOWN_DRAIN_MS: '0',
      LOG_LEVEL: 'info',
      ...env
    },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let output = ''
  child.stdout?.on('data', (d: Buffer) => { output += d.toString() })
  child.stderr?.on('data', (d: Buffer) => { output += d.toString() })
  const exited = once(child, 'exit').then(([code, signal]) => ({ code: code as number | null, signal: signal as string | null }))
  t.teardown(() => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL') })
  const stop = async (): Promise<number | null> => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM')
    return (await exited).code
  }
  return { name, base: `http://127.0.0.1:${port}`, metricsPort, child, output: () => output, exited, stop }
}

/** The instances' log lines at level error or above (pino: 50+), cut short. */
function errorLines (instances: Instance[]): string[] {
  return instances.flatMap(instance => instance.output().split('\n')
    .filter(line => /"level":(5|6)0/.test(line))
    .map(line => `${instance.name}: ${line.slice(0, 400)}`))
}

async function ready (instance: Instance, timeoutMs = 60000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (instance.child.exitCode !== null) throw new Error(`${instance.name} exited with ${instance.child.exitCode}:\n${instance.output().slice(-3000)}`)
    const status = await fetch(`${instance.base}/health/ready`, { signal: AbortSignal.timeout(2000) }).then(res => res.status, () => 0)
    if (status === 200) return
    if (Date.now() > deadline) throw new Error(`${instance.name} not ready after ${timeoutMs} ms (last answer ${status}):\n${instance.output().slice(-3000)}`)
    await sleep(100)
  }
}

async function metric (instance: Instance, name: string, labels = ''): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${instance.metricsPort}/metrics`)).text()
  const line = text.split('\n').find(l => l.startsWith(`${name}${labels} `) || (labels === '' && l.startsWith(`${name}{`)))
  return line === undefined ? 0 : Number(line.split(' ').pop())
}

/** The migration lock (node-pg-migrate's key), held by the test on a direct connection until `waiters` others wait for it. */
async function holdMigrationLock (url: string): Promise<{ releaseOnceWaiting: (waiters: number, timeoutMs: number) => Promise<number> }> {
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
          const { rows } = await client.query<{ n: number }>("SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
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
        await client.query('SELECT pg_sleep(0.002)').then(() => { queries++ }, async () => { await sleep(50) })
      }
    } catch {
      // The database may not accept connections yet in the first milliseconds: the others carry on.
    } finally {
      await client.end().catch(() => {})
    }
  })
  return { stop: async () => { state.running = false; await Promise.all(clients); return queries } }
}

// ---------- load and audit ----------

interface Answer { status: number, body: string, retryAfter: string | null, failure?: string }

async function send (base: string, method: 'GET' | 'POST', body?: unknown, headers: Record<string, string> = {}): Promise<Answer> {
  try {
    const res = await fetch(`${base}/v1/categories`, {
      method,
      headers: { authorization: `Bearer ${API_KEY}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(15000)
    })
    return { status: res.status, body: await res.text(), retryAfter: res.headers.get('retry-after') }
  } catch (err) {
    return { status: 0, body: '', retryAfter: null, failure: String(err) }
  }
}

/** Why an answer breaks the rules (anything but 2xx, or a 503 Error body with Retry-After), or undefined. */
function wrongAnswer (what: string, a: Answer): string | undefined {
  if (a.failure !== undefined) return `${what}: transport failure ${a.failure}`
  if (a.status >= 200 && a.status < 300) return undefined
  if (a.status !== 503) return `${what}: ${a.status} ${a.body.slice(0, 200)}`
  try {
    const body = JSON.parse(a.body) as Record<string, unknown>
    if (Object.keys(body).sort().join() !== ERROR_KEYS.join() || body.code !== 'SERVICE_UNAVAILABLE') return `${what}: 503 with a wrong body ${a.body}`
  } catch {
    return `${what}: 503 without a JSON body`
  }
  return a.retryAfter === null ? `${what}: 503 without Retry-After` : undefined
}

interface Created { id: string, name: string, answeredAt: number }
interface Listed { instance: string, sentAt: number, ids: Set<string> }

/**
 * Writers (half of them with an Idempotency-Key, retried with the same key until
 * answered) and readers spread over the instances for `ms`; then the audit.
 */
async function loadAndAudit (t: Test, instances: Instance[], databaseUrl: string, ms: number): Promise<void> {
  const run = `load-${Date.now().toString(36)}`
  const created: Created[] = []
  const lists: Listed[] = []
  const problems: string[] = []
  const sent = new Set<string>()
  const keyed = new Set<string>()
  let unavailable = 0
  const until = performance.now() + ms
  const writer = async (w: number): Promise<void> => {
    for (let i = 0; performance.now() < until; i++) {
      const instance = instances[(w + i) % instances.length] as Instance
      const name = `${run}-w${w}-${i}`
      sent.add(name)
      const withKey = w % 2 === 0
      if (withKey) keyed.add(name)
      for (let attempt = 0; attempt < (withKey ? 20 : 1); attempt++) {
        const answer = await send(instance.base, 'POST', { name }, withKey ? { 'idempotency-key': name } : {})
        const problem = wrongAnswer(`create on ${instance.name}`, answer)
        if (problem !== undefined) { problems.push(problem); break }
        if (answer.status === 201) {
          const body = JSON.parse(answer.body) as { id: number | string, name: string }
          created.push({ id: String(body.id), name: body.name, answeredAt: performance.now() })
          break
        }
        unavailable++
        // 409 (the first attempt still running) or 503: the same key again.
        await sleep(50)
      }
    }
  }
  const reader = async (r: number): Promise<void> => {
    for (let i = 0; performance.now() < until; i++) {
      const instance = instances[(r + i) % instances.length] as Instance
      const sentAt = performance.now()
      const answer = await send(instance.base, 'GET')
      const problem = wrongAnswer(`list on ${instance.name}`, answer)
      if (problem !== undefined) problems.push(problem)
      else if (answer.status === 200) lists.push({ instance: instance.name, sentAt, ids: new Set((JSON.parse(answer.body) as Array<{ id: number }>).map(c => String(c.id))) })
      else unavailable++
      await sleep(5)
    }
  }
  await Promise.all([...Array.from({ length: 8 }, async (_, w) => await writer(w)), ...Array.from({ length: 4 }, async (_, r) => await reader(r))])

  const { rows } = await withClient(databaseUrl, async c => await c.query<{ id: string, name: string }>('SELECT id::text, name FROM categories'))
  const table = new Map(rows.map(r => [r.id, r.name]))
  const stale = lists.flatMap(list => created
    .filter(c => c.answeredAt <= list.sentAt - CONSISTENCY_MS && !list.ids.has(c.id))
    .map(c => `${c.id} answered ${Math.round(list.sentAt - c.answeredAt)} ms before a list on ${list.instance} was sent, missing from it`))
  t.comment(`${created.length} creates answered 201, ${lists.length} lists, ${unavailable} answers 503/409, ${rows.length} rows`)
  t.ok(created.length > 50, 'the load created categories')
  t.same(problems.slice(0, 10), [], 'no 500, no other unexpected status, no transport failure')
  if (problems.length > 0) t.comment(`what the instances logged at error level:\n${errorLines(instances).slice(0, 5).join('\n')}`)
  t.same(created.filter(c => table.get(c.id) !== c.name).slice(0, 10), [], 'every id answered 201 is in the table with its name')
  t.same(rows.filter(r => !sent.has(r.name)).slice(0, 10), [], 'no row that no client sent')
  const perName = new Map<string, number>()
  for (const r of rows) perName.set(r.name, (perName.get(r.name) ?? 0) + 1)
  t.same([...keyed].filter(name => (perName.get(name) ?? 0) > 1).slice(0, 10), [], 'a create with an Idempotency-Key is stored at most once')
  t.same(stale.slice(0, 10), [], `every list holds every create answered ${CONSISTENCY_MS} ms or more before it was sent`)
  for (const instance of instances) {
    t.equal(instance.child.exitCode, null, `${instance.name} is still running`)
    const list = await send(instance.base, 'GET')
    t.equal(list.status, 200)
    t.equal((JSON.parse(list.body) as unknown[]).length, rows.length, `${instance.name}'s list is the table`)
  }
}

/** A create on `from` must be in `to`'s list within CONSISTENCY_MS, every time. */
async function crossInstanceProbe (t: Test, from: Instance, to: Instance, rounds = 10): Promise<void> {
  for (let i = 0; i < rounds; i++) {
    await send(to.base, 'GET') // `to` holds whatever it caches
    const answer = await send(from.base, 'POST', { name: `probe-${Date.now()}-${i}` })
    t.equal(answer.status, 201)
    const id = String((JSON.parse(answer.body) as { id: number }).id)
    const answeredAt = performance.now()
    let seenAfter: number | undefined
    while (seenAfter === undefined && performance.now() - answeredAt <= CONSISTENCY_MS) {
      const sentAt = performance.now()
      const list = await send(to.base, 'GET')
      if (list.status === 200 && (JSON.parse(list.body) as Array<{ id: number }>).some(c => String(c.id) === id)) seenAfter = sentAt - answeredAt
      else await sleep(2)
    }
    t.ok(seenAfter !== undefined, `create ${i} on ${from.name} is in ${to.name}'s list ${seenAfter === undefined ? 'never within 100 ms' : `in a list sent ${seenAfter.toFixed(1)} ms after the 201`}`)
  }
}

// ---------- the tests ----------

for (const mode of ['transaction', 'session'] as PoolMode[]) {
  t.test(`PgBouncer, ${mode} pooling`, async t => {
    const bouncer: PgBouncer = await startPgBouncer(t, db.url, mode)

    t.test('a statement over DB_STATEMENT_TIMEOUT_MS is a 503 (the server cancels it), not a hang', async t => {
      const url = await db.createDatabase()
      const { app } = await testApp(t, bouncer.urlFor(url), { DB_STATEMENT_TIMEOUT_MS: '300' })
      const created = await app.inject({ method: 'POST', url: '/v1/categories', headers: { ...AUTH, 'content-type': 'application/json' }, payload: '{"name":"before the lock"}' })
      t.equal(created.statusCode, 201, created.body)
      const locker = new pg.Client({ connectionString: url })
      await locker.connect()
      t.teardown(async () => { await locker.end() })
      await locker.query('BEGIN')
      await locker.query('LOCK TABLE categories IN ACCESS EXCLUSIVE MODE')
      for (const request of [
        { method: 'POST' as const, url: '/v1/categories', headers: { ...AUTH, 'content-type': 'application/json' }, payload: '{"name":"behind the lock"}' },
        { method: 'GET' as const, url: '/v1/categories/1', headers: AUTH }
      ]) {
        const started = performance.now()
        const res = await app.inject(request)
        const ms = performance.now() - started
        t.equal(res.statusCode, 503, `${request.method} ${request.url}`)
        t.equal(res.json().code, 'SERVICE_UNAVAILABLE')
        t.ok(ms < 3000, `answered in ${Math.round(ms)} ms`)
      }
      const { rows } = await locker.query<{ query: string }>("SELECT query FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
      t.same(rows, [], 'no statement still waits for the lock on the server: it was canceled there, not abandoned by the client')
      await locker.query('ROLLBACK')
      const list = (await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })).json() as Array<{ name: string }>
      t.same(list.map(c => c.name), ['before the lock'], 'the timed-out create left no row')
    })

    // Session pooling keeps each connection's session: prepared statements may be turned on there.
    for (const preparedStatements of mode === 'session' ? ['false', 'true'] : ['false']) {
      t.test(`every statement works on whichever server connection the pooler hands out (DB_PREPARED_STATEMENTS=${preparedStatements})`, async t => {
        const url = await db.createDatabase()
        const { app } = await testApp(t, bouncer.urlFor(url), { DB_PREPARED_STATEMENTS: preparedStatements })
        const statuses = new Map<string, number>()
        const failures: string[] = []
        await Promise.all(Array.from({ length: 20 }, async (_, client) => {
          for (let i = 0; i < 15; i++) {
            const name = `statement-${client}-${i}`
            const requests = [
              { method: 'POST' as const, url: '/v1/categories', headers: { ...AUTH, 'content-type': 'application/json' }, payload: JSON.stringify({ name }) },
              { method: 'POST' as const, url: '/v1/categories', headers: { ...AUTH, 'content-type': 'application/json', 'idempotency-key': name }, payload: JSON.stringify({ name: `${name} keyed` }) },
              { method: 'GET' as const, url: '/v1/categories', headers: AUTH },
              { method: 'GET' as const, url: `/v1/categories/${1 + i}`, headers: AUTH }
            ]
            const request = requests[(client + i) % requests.length] as typeof requests[number]
            const res = await app.inject(request)
            const key = `${request.method} ${request.url.replace(/\d+$/, ':id')} ${res.statusCode}`
            statuses.set(key, (statuses.get(key) ?? 0) + 1)
            if (res.statusCode >= 500) failures.push(`${key}: ${res.body}`)
          }
        }))
        t.comment(JSON.stringify(Object.fromEntries(statuses)))
        t.same(failures.slice(0, 5), [], 'no 5xx among 300 requests over 20 concurrent clients')
      })
    }

    t.test('two instances under create/list load, with and without Idempotency-Key: nothing lost, nothing invented, no 500, nobody exits', async t => {
      const url = await db.createDatabase()
      // One after the other: starting together is the next test's subject.
      const instances: Instance[] = []
      for (const name of ['A', 'B']) {
        instances.push(await startInstance(t, `${mode} ${name}`, { DATABASE_URL: bouncer.urlFor(url) }))
        await ready(instances[instances.length - 1] as Instance, 30000)
      }
      await loadAndAudit(t, instances, url, 6000)
      await t.test(`a create on one instance is in the other's list within ${CONSISTENCY_MS} ms`, async t => {
        const [a, b] = instances as [Instance, Instance]
        await crossInstanceProbe(t, a, b)
        const reads = async (source: string): Promise<number> => await metric(b, 'categories_list_reads_total', `{source="${source}"}`)
        t.comment(`B's list reads: ${JSON.stringify({ cache: await reads('cache'), database: await reads('database') })}`)
        if (mode === 'transaction') {
          // LISTEN through a transaction pooler hears nothing: the feed must know it, and say so.
          t.equal(await metric(b, 'categories_change_feed_listening'), 0, 'B\'s feed does not claim to hear')
          t.ok(await metric(b, 'categories_change_feed_probes_missed') > 0, 'its probes went unheard')
          t.ok(await reads('database') > 0, 'B reads the list from the database')
          t.match(b.output(), /did not hear its own notification.*set DATABASE_DIRECT_URL/, 'and its log names the setting that fixes it')
        } else {
          // A session pooler keeps the listening connection's session: LISTEN works.
          t.equal(await metric(b, 'categories_change_feed_listening'), 1, 'B\'s feed hears')
          t.ok(await reads('cache') > 0, 'B serves the list from its cache')
        }
      })
      for (const instance of instances) t.equal(await instance.stop(), 0, `${instance.name} exits 0 on SIGTERM`)
    })

    t.test('three instances starting together on a fresh database through the pooler, three times', async t => {
      for (let round = 1; round <= 3; round++) {
        const url = await db.createDatabase()
        // Rounds 1 and 2 make sure the three really meet: the test holds the migration lock (as a fourth instance
        // would) until all three wait for it. Round 3 lets them start as they come.
        const gate = round < 3 ? await holdMigrationLock(url) : undefined
        // Other clients of the database (the old version of a rolling deploy, say) keep the pooler's server connections busy.
        const others = otherClients(bouncer.urlFor(url), 4)
        const instances = await Promise.all([1, 2, 3].map(async i => await startInstance(t, `${mode} round ${round} #${i}`, { DATABASE_URL: bouncer.urlFor(url) })))
        if (gate !== undefined) {
          const waiting = await gate.releaseOnceWaiting(3, 30000)
          t.equal(waiting, 3, `round ${round}: all three instances waited for the migration lock at once`)
        }
        const started = performance.now()
        const outcomes = await Promise.allSettled(instances.map(async instance => { await ready(instance, 30000) }))
        t.comment(`round ${round}: all ready ${Math.round(performance.now() - started)} ms after ${gate === undefined ? 'starting' : 'the lock was released'}`)
        t.comment(`round ${round}: other clients ran ${await others.stop()} queries meanwhile`)
        t.same(outcomes.filter(o => o.status === 'rejected').map(o => String((o as PromiseRejectedResult).reason).slice(0, 1500)), [], `round ${round}: all three ready`)
        const { rows } = await withClient(url, async c => await c.query<{ total: number, names: number }>('SELECT count(*)::int AS total, count(DISTINCT name)::int AS names FROM pgmigrations'))
        t.same(rows[0], { total: rows[0]?.names, names: rows[0]?.names }, `round ${round}: each migration recorded once (${rows[0]?.names ?? 0} migrations)`)
        const locks = await withClient(url, async c => await c.query("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"))
        t.equal(locks.rowCount, 0, `round ${round}: no advisory lock is left held`)
        for (const instance of instances) t.equal(await instance.stop(), 0, `${instance.name} exits 0 on SIGTERM`)
      }
    })
  })
}

t.test('transaction pooling with DATABASE_DIRECT_URL: the change feed listens directly, hears, and the cache keeps the 100 ms rule', async t => {
  const bouncer = await startPgBouncer(t, db.url, 'transaction')
  const url = await db.createDatabase()
  const instances: Instance[] = []
  for (const name of ['A', 'B']) {
    instances.push(await startInstance(t, `direct ${name}`, { DATABASE_URL: bouncer.urlFor(url), DATABASE_DIRECT_URL: url }))
    await ready(instances[instances.length - 1] as Instance, 30000)
  }
  const [a, b] = instances as [Instance, Instance]
  for (const instance of instances) {
    const deadline = Date.now() + 10000
    while (await metric(instance, 'categories_change_feed_listening') !== 1 && Date.now() < deadline) await sleep(50)
    t.equal(await metric(instance, 'categories_change_feed_listening'), 1, `${instance.name}'s feed hears`)
    t.equal(await metric(instance, 'categories_change_feed_connection_info', '{connection="DATABASE_DIRECT_URL"}'), 1, 'on DATABASE_DIRECT_URL')
    t.comment(`${instance.name}: probe echo ${(await metric(instance, 'categories_change_feed_echo_seconds') * 1000).toFixed(1)} ms`)
  }
  await loadAndAudit(t, instances, url, 4000)
  const cacheReads = await metric(b, 'categories_list_reads_total', '{source="cache"}')
  await crossInstanceProbe(t, a, b)
  await crossInstanceProbe(t, b, a)
  t.ok(await metric(b, 'categories_list_reads_total', '{source="cache"}') > cacheReads, 'B served lists from its cache')
  for (const instance of instances) t.equal(await instance.stop(), 0, `${instance.name} exits 0 on SIGTERM`)
})
