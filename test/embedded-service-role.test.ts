import { mkdtemp, readFile, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import pg from 'pg'
import t, { type Test } from 'tap'
import { LISTENER_APPLICATION_NAME } from '../src/machinery/change-feed.js'
import { SERVICE_ROLE } from '@petstore/embedded-postgres'
import { categoriesRequest, startServer } from './helpers/server-process.js'

/*
 * With the embedded database the service connects as a role of its own, which owns its database and tables
 * and nothing more; the superuser stays the operators', untouched by the service's statement timeout.
 */

t.setTimeout(240000)

async function dataDir (): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), 'petstore-role-'))
  t.teardown(async () => {
    await rm(dir, { recursive: true, force: true })
  })
  return dir
}

const secret = async (dir: string, name: string): Promise<string> =>
  (await readFile(path.join(dir, name), 'utf8')).trim()

/** Connects as an operator would (docs/development.md): the port from the running cluster's postmaster.pid. */
async function psql (t: Test, dir: string, role: string, passwordFile: string): Promise<pg.Client> {
  const location = await readFile(path.join(dir, 'postgres-location'), 'utf8').catch(() => path.join(dir, 'postgres'))
  const port = (await readFile(path.join(location.trim(), 'postmaster.pid'), 'utf8')).split('\n')[3]
  const client = new pg.Client({
    host: '127.0.0.1',
    port: Number(port),
    user: role,
    database: 'postgres',
    password: await secret(dir, passwordFile)
  })
  // The server's stop ends the session; unheard, that 'error' would end the test process.
  client.on('error', () => {})
  await client.connect()
  t.teardown(async () => {
    await client.end()
  })
  return client
}

async function serviceSessionRoles (superuser: pg.Client): Promise<unknown[]> {
  const { rows } = await superuser.query(
    `
    SELECT DISTINCT usename, rolsuper, rolcreaterole, rolcreatedb
    FROM pg_stat_activity JOIN pg_roles ON rolname = usename
    WHERE application_name LIKE 'petstore/%' OR application_name = $1`,
    [LISTENER_APPLICATION_NAME]
  )
  return rows
}

async function owners (superuser: pg.Client): Promise<unknown[]> {
  const { rows } = await superuser.query(`
    SELECT 'database' AS kind, pg_get_userbyid(datdba) AS owner FROM pg_database WHERE datname = current_database()
    UNION SELECT 'table', pg_get_userbyid(relowner) FROM pg_class
    WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'
    UNION SELECT 'function', pg_get_userbyid(proowner) FROM pg_proc WHERE pronamespace = 'public'::regnamespace
    ORDER BY kind`)
  return rows
}

const ownedByService = [
  { kind: 'database', owner: SERVICE_ROLE },
  { kind: 'function', owner: SERVICE_ROLE },
  { kind: 'table', owner: SERVICE_ROLE }
]

t.test('a new data directory: the service connects as its own role, which may do nothing but own its data', async t => {
  const dir = await dataDir()
  const server = await startServer(t, { DATA_DIR: dir })
  t.equal((await categoriesRequest(server, await secret(dir, 'dev-api-key'), 'POST', { name: 'written' })).status, 201)

  const superuser = await psql(t, dir, 'postgres', 'postgres-password')
  t.same(
    await serviceSessionRoles(superuser),
    [{ usename: SERVICE_ROLE, rolsuper: false, rolcreaterole: false, rolcreatedb: false }],
    'every session of the service (pool and change feed) runs as the role, ' +
      'which is no superuser and may create no role or database'
  )
  t.same(await owners(superuser), ownedByService, 'it owns the database, its tables and functions')
  t.equal(
    (await superuser.query('SHOW statement_timeout')).rows[0].statement_timeout,
    '0',
    'the superuser has no statement timeout'
  )

  const service = await psql(t, dir, SERVICE_ROLE, `${SERVICE_ROLE}-password`)
  t.equal(
    (await service.query('SHOW statement_timeout')).rows[0].statement_timeout,
    '5s',
    "the service's role has DB_STATEMENT_TIMEOUT_MS"
  )
  await t.rejects(service.query('CREATE DATABASE elsewhere'), /permission denied to create database/)
  await t.rejects(service.query('CREATE ROLE other'), /permission denied to create role/)
  server.child.kill('SIGTERM')
  t.equal(await server.exited, 0)
})
