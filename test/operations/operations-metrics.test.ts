import type { FastifyInstance } from 'fastify'
import pg from 'pg'
import t, { type Test } from 'tap'
import { sha256 } from '../../src/config.js'
import { generateKey, keyPrefix } from '../../src/keys/store.js'
import { metric, testApp, until } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { withClient } from '../helpers/pg-client.js'
import { TcpProxy } from '../helpers/tcp-proxy.js'

/*
 * The metrics the alert rules (deploy/prometheus) need from the service: whether an instance is ready and why not,
 * computed by the readiness check itself at scrape time, and the managed keys' store.
 */

const db = await testDatabase(t)
/** A short-lived key's life: it outlasts the inserts and the reload that count it, even on a loaded machine. */
const SHORT_LIFE_MS = 2000
const REASONS = [
  'shutting_down',
  'database_unavailable',
  'database_read_only',
  'migrations_not_applied',
  'lists_not_built'
]

async function sql (url: string, text: string, values: unknown[] = []): Promise<Array<Record<string, unknown>>> {
  return await withClient(url, async client => (await client.query(text, values)).rows)
}

/** One scrape of the app's registry, as Prometheus sees it. */
async function scrape (app: FastifyInstance): Promise<string> {
  return await app.metrics.metrics()
}

/** health_ready and health_not_ready in one scrape agree with GET /health/ready, and name `reason` alone. */
async function readinessSays (t: Test, app: FastifyInstance, reason: string | undefined): Promise<void> {
  const text = await scrape(app)
  const ready = await app.inject({ method: 'GET', url: '/health/ready' })
  t.equal(ready.statusCode, reason === undefined ? 200 : 503, `GET /health/ready: ${ready.body}`)
  t.match(text, new RegExp(`^health_ready ${reason === undefined ? 1 : 0}$`, 'm'), `health_ready: ${reason ?? 'ready'}`)
  for (const each of REASONS) {
    t.match(text, new RegExp(`^health_not_ready\\{reason="${each}"\\} ${each === reason ? 1 : 0}$`, 'm'), each)
  }
}

t.test('health_ready and health_not_ready{reason} follow the readiness check, cause by cause', async t => {
  const target = new URL(db.url)
  const proxy = await TcpProxy.start({ host: target.hostname, port: Number(target.port) })
  t.teardown(async () => {
    await proxy.close()
  })
  const { app } = await testApp(t, proxy.url(db.url))
  await readinessSays(t, app, undefined)

  const [last] = await sql(db.url, 'SELECT name FROM pgmigrations ORDER BY run_on DESC, id DESC LIMIT 1')
  await sql(db.url, 'DELETE FROM pgmigrations WHERE name = $1', [last?.name])
  await readinessSays(t, app, 'migrations_not_applied')
  await sql(db.url, 'INSERT INTO pgmigrations (name, run_on) VALUES ($1, now())', [last?.name])

  // A session opened before the setting keeps writing: it is how the setting is taken back.
  const admin = new pg.Client({ connectionString: db.url })
  await admin.connect()
  t.teardown(async () => {
    await admin.end()
  })
  const database = target.pathname.slice(1)
  await admin.query(`ALTER DATABASE ${database} SET default_transaction_read_only = on`)
  t.teardown(async () => {
    await admin.query(`ALTER DATABASE ${database} RESET default_transaction_read_only`)
  })
  proxy.cutAll() // new sessions get the database's setting
  await until('the pool has new sessions', async () => (await app.inject({ url: '/health/ready' })).statusCode === 503)
  await readinessSays(t, app, 'database_read_only')
  await admin.query(`ALTER DATABASE ${database} RESET default_transaction_read_only`)
  proxy.cutAll()
  await until('writable again', async () => (await app.inject({ url: '/health/ready' })).statusCode === 200)

  proxy.down()
  await readinessSays(t, app, 'database_unavailable')
  proxy.restore()
  await until('reachable again', async () => (await app.inject({ url: '/health/ready' })).statusCode === 200)
  await readinessSays(t, app, undefined)

  app.lifecycle.shuttingDown = true
  await readinessSays(t, app, 'shutting_down')
  app.lifecycle.shuttingDown = false
})

t.test('api_keys_active counts the managed keys that authenticate now; failed reads count', async t => {
  const url = await db.createDatabase()
  const target = new URL(url)
  const proxy = await TcpProxy.start({ host: target.hostname, port: Number(target.port) })
  t.teardown(async () => {
    await proxy.close()
  })
  const { app } = await testApp(t, proxy.url(url))
  const issue = async (expiresInMs: number | null): Promise<string> => {
    const key = generateKey()
    const [row] = await sql(
      url,
      `INSERT INTO api_keys (name, scope, prefix, digest, expires_at)
      VALUES ('metrics', 'read', $1, $2, now() + $3::float8 * interval '1 millisecond') RETURNING id`,
      [keyPrefix(key), sha256(key), expiresInMs]
    )
    return String(row?.id)
  }
  t.equal(await metric(app, 'api_keys_active'), 0, 'no managed key yet (static keys are not counted)')
  const kept = await issue(null)
  await issue(null)
  await issue(SHORT_LIFE_MS)
  await app.apiKeys.reload()
  t.equal(await metric(app, 'api_keys_active'), 3)
  const expired = async (): Promise<boolean> => (await metric(app, 'api_keys_active')) === 2
  await until('the short-lived key expired', expired, 5 * SHORT_LIFE_MS, 20)
  await sql(url, 'UPDATE api_keys SET revoked_at = now() WHERE id = $1', [kept])
  await app.apiKeys.reload()
  t.equal(await metric(app, 'api_keys_active'), 1, 'a revoked key no longer counts')

  // Counted from before the outage: a start on a loaded machine may have had a failed read of its own.
  const failures = await metric(app, 'api_keys_reload_failures_total')
  proxy.down()
  await app.apiKeys.reload()
  t.ok((await metric(app, 'api_keys_reload_failures_total')) > failures, 'a read the database refused counts')
  t.equal(await metric(app, 'api_keys_active'), 1, 'the keys known before still count')
  proxy.restore()
})
