import { chmod, copyFile, mkdir, mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyInstance } from 'fastify'
import pg from 'pg'
import t from 'tap'
import { LISTENER_APPLICATION_NAME } from '../../src/machinery/change-feed.js'
import { startEmbeddedPostgres } from '@petstore/embedded-postgres'
import { runMigrations } from '../../src/db/migrate.js'
import { AUTH, json, metric, testApp, until } from '../helpers/app.js'
import { TcpProxy } from '../helpers/tcp-proxy.js'

/*
 * The database address moves to another server while sessions stay open on
 * the old one (a DNS change after a failover nobody fenced, a balancer without
 * shutdown-sessions). As soon as a new connection reaches the new server,
 * every connection left on the old one is closed: the change feed moves too
 * (left there, it would never hear of the new server's changes and the cached
 * list would stay stale for good), and no read is served from the old data.
 */

// Two servers of our own that accept the same credentials (the second is given the first's password).
const dir = await mkdtemp(path.join(tmpdir(), 'petstore-server-moves-'))
t.teardown(async () => {
  await rm(dir, { recursive: true, force: true })
})
await chmod(dir, 0o711) // as root, PostgreSQL runs as the postgres user, which must reach the data directories
const oldServer = await startEmbeddedPostgres({ dir: path.join(dir, 'old') })
t.teardown(async () => {
  await oldServer.stop()
})
await mkdir(path.join(dir, 'new'))
for (const secret of ['postgres-password', 'petstore-password']) {
  await copyFile(path.join(dir, 'old', secret), path.join(dir, 'new', secret))
}
const newServer = await startEmbeddedPostgres({ dir: path.join(dir, 'new') })
t.teardown(async () => {
  await newServer.stop()
})
// The service connects as its own role, the same on both servers; the admins as the superuser.
const oldUrl = oldServer.serviceUrl
const newUrl = newServer.serviceUrl
await runMigrations(newUrl, { info: () => {}, warn: () => {}, error: () => {} })

const proxy = await TcpProxy.start({ host: '127.0.0.1', port: Number(new URL(oldUrl).port) })
t.teardown(async () => {
  await proxy.close()
})
const { app } = await testApp(t, proxy.url(oldUrl))

async function client (url: string): Promise<pg.Client> {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  t.teardown(async () => {
    await c.end()
  })
  return c
}
const oldAdmin = await client(oldServer.url)
const newAdmin = await client(newServer.url)

async function names (target: FastifyInstance): Promise<string[]> {
  const res = await target.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  return (res.json() as Array<{ name: string }>).map(c => c.name)
}
const sessions = async (admin: pg.Client, applicationName: string): Promise<number> =>
  (
    await admin.query<{ n: number }>('SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE $1', [
      applicationName
    ])
  ).rows[0]?.n ?? 0

t.test('after the address moves, the first connection to the new server closes those left on the old one', async t => {
  t.equal(
    (await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name: 'on the old server' }) })).statusCode,
    201
  )
  await until('the change feed listens', async () => (await metric(app, 'change_feed_listening')) === 1, 10000, 20)
  t.same(await names(app), ['on the old server'], 'cached from the old server')

  await newAdmin.query("INSERT INTO categories (name) VALUES ('on the new server')")
  proxy.repoint({ host: '127.0.0.1', port: Number(new URL(newUrl).port) }, { cutOpen: false })
  t.ok((await sessions(oldAdmin, LISTENER_APPLICATION_NAME)) === 1, 'the change feed stays on the old server for now')
  // The pool's sessions on the old server end (the feed's stays): its next connection reaches the new server.
  await oldAdmin.query(
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'petstore/%'"
  )
  // Lists are served from the cache; a create needs a connection (its first may take a terminated one: 503).
  let created = 0
  for (let i = 0; i < 50 && created !== 201; i++) {
    created = (await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name: 'after the move' }) }))
      .statusCode
  }
  t.equal(created, 201, 'a create after the move')
  let after: string[] = []
  for (let i = 0; i < 200 && after.length !== 2; i++) {
    const res = await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
    if (res.statusCode === 200) after = (res.json() as Array<{ name: string }>).map(c => c.name)
    else await sleep(20)
  }
  t.same(after, ['on the new server', 'after the move'], "the list is the new server's")
  const feedMoved = async (): Promise<boolean> =>
    (await sessions(oldAdmin, LISTENER_APPLICATION_NAME)) === 0 && (await metric(app, 'change_feed_listening')) === 1
  await until('the change feed left the old server and listens again', feedMoved, 10000, 20)
  t.equal(
    await sessions(oldAdmin, 'petstore%'),
    0,
    'no session of the service is left on the old server (change feed included)'
  )
  t.equal(await sessions(newAdmin, LISTENER_APPLICATION_NAME), 1, 'the change feed listens on the new server')

  // The new server's changes are heard: a row written there by someone else is in the next list.
  await newAdmin.query("INSERT INTO categories (name) VALUES ('written elsewhere')")
  const heard = async (): Promise<boolean> => (await names(app)).includes('written elsewhere')
  await t.resolves(until('the cached list has the row', heard, 5000, 10), 'the cached list hears the new server')
})

t.test(
  'a statement whose outcome is unknown makes the service ask where the address leads: ' +
    'the connections left on the old server close at once, not one timeout each',
  async t => {
    const moving = await TcpProxy.start({ host: '127.0.0.1', port: Number(new URL(oldUrl).port) })
    t.teardown(async () => {
      await moving.close()
    })
    const { app: mover, logs } = await testApp(t, moving.url(oldUrl), {
      DB_STATEMENT_TIMEOUT_MS: '1000',
      DB_POOL_MAX: '4'
    })
    const getFirst = async (): Promise<{ status: number; name?: string }> => {
      const res = await mover.inject({ method: 'GET', url: '/v1/categories/1', headers: AUTH })
      return {
        status: res.statusCode,
        name: res.statusCode === 200 ? (res.json() as { name: string }).name : undefined
      }
    }
    // Several pool connections on the old server, idle (the app before has moved: only this one's are there).
    await Promise.all(Array.from({ length: 8 }, getFirst))
    t.same(await getFirst(), { status: 200, name: 'on the old server' })
    const pids = (
      await oldAdmin.query<{ pid: number }>("SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'petstore/%'")
    ).rows.map(r => r.pid)
    t.ok(pids.length >= 2, `${pids.length} pool connections on the old server`)
    moving.repoint({ host: '127.0.0.1', port: Number(new URL(newUrl).port) }, { cutOpen: false })
    // The old server stops answering on them, as an old primary does whose commits wait for a standby that is gone.
    for (const pid of pids) process.kill(pid, 'SIGSTOP')
    t.teardown(() => {
      for (const pid of pids) process.kill(pid, 'SIGCONT')
    })

    t.equal((await getFirst()).status, 503, 'the first statement on a silent connection: 503 after its timeout')
    const moved = /leads to another server now/
    const found = async (): Promise<boolean> => logs.lines.some(line => moved.test(line))
    await t.resolves(until('the log says the address moved', found, 5000, 10),
      'a new connection found the new server and closed those left on the old one')
    t.same(await getFirst(), { status: 200, name: 'on the new server' }, 'the next statement runs on the new server')
  }
)
