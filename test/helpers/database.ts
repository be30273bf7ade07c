import { randomBytes } from 'node:crypto'
import { withClient } from './pg-client.js'
import {
  chooseSource,
  describeChoice,
  startPostgresServer,
  type DatabaseSource,
  type PostgresServer
} from './postgres-server.js'

/**
 * A PostgreSQL database of this test file's own, dropped when the file's tests end.
 * Under `npm test` it lives on the run's one server (scripts/run-tests.ts passes it in
 * TEST_DATABASE_SERVER_URL); a file run on its own (`npx tap test/x.test.ts`) starts a
 * server of its own, chosen the same way (test/helpers/postgres-server.ts), and says which.
 */
export interface TestDatabase {
  /** As the service connects: a role of the file's own that owns its databases and nothing more (no superuser). */
  url: string
  /** The same database as the server's superuser, for what only an operator may do. */
  adminUrl: string
  /** Where its server came from. */
  source: DatabaseSource
  /** Creates one more empty database on the same server, owned by the same role (for tests that need two). */
  createDatabase: () => Promise<string>
  /** A URL's database as the server's superuser. */
  adminUrlFor: (url: string) => string
  close: () => Promise<void>
}

interface Teardown {
  teardown: (fn: () => Promise<void> | void) => void
  comment: (...message: unknown[]) => void
}

/** Set by scripts/run-tests.ts for the test processes: the run's server and its source. */
export const SERVER_URL_VARIABLE = 'TEST_DATABASE_SERVER_URL'
export const SERVER_SOURCE_VARIABLE = 'TEST_DATABASE_SERVER_SOURCE'

function withDatabase (serverUrl: string, database: string, role?: { name: string; password: string }): string {
  const url = new URL(serverUrl)
  url.pathname = `/${database}`
  if (role !== undefined) {
    url.username = role.name
    url.password = role.password
  }
  return url.toString()
}

async function onServer (serverUrl: string, sql: string[]): Promise<void> {
  await withClient(serverUrl, async admin => {
    for (const statement of sql) await admin.query(statement)
  })
}

async function runServer (t: Teardown): Promise<PostgresServer> {
  const url = process.env[SERVER_URL_VARIABLE]
  if (url !== undefined && url !== '') {
    return { url, source: process.env[SERVER_SOURCE_VARIABLE] as DatabaseSource, stop: async () => {} }
  }
  const choice = await chooseSource()
  t.comment(`test database (this file only; npm test starts one server per run): ${describeChoice(choice)}`)
  return await startPostgresServer(choice)
}

export async function testDatabase (t: Teardown): Promise<TestDatabase> {
  const server = await runServer(t)
  // One role per file owns each of its databases (one login for a pooler in front, as in a deployment).
  const role = { name: `petstore_test_${randomBytes(6).toString('hex')}`, password: randomBytes(12).toString('hex') }
  await onServer(server.url, [`CREATE ROLE ${role.name} LOGIN PASSWORD '${role.password}'`])
  const created: string[] = []
  let closed = false
  let closing: Promise<void> | undefined
  const dropAll = async (): Promise<void> => {
    await onServer(server.url, [
      ...created.map(name => `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`),
      `DROP ROLE IF EXISTS ${role.name}`
    ])
  }
  const createDatabase = async (): Promise<string> => {
    const name = created.length === 0 ? role.name : `petstore_test_${randomBytes(6).toString('hex')}`
    // A file that awaits testDatabase(t) after starting a subtest can end before it resolves (tap then drops its
    // later subtests): once the teardown has run, nothing would drop a database made now.
    const ended = new Error(
      `${name}: the test ended before its database was ready: await testDatabase(t) before the file's first subtest`
    )
    // The teardown may still be dropping the role: the caller finds nothing left behind once this throws.
    if (closed) {
      await closing?.catch(() => {})
      throw ended
    }
    await onServer(server.url, [`CREATE DATABASE ${name} OWNER ${role.name}`])
    if (closed) {
      await onServer(server.url, [`DROP DATABASE ${name}`, `DROP ROLE IF EXISTS ${role.name}`]).catch(() => {})
      throw ended
    }
    created.push(name)
    return withDatabase(server.url, name, role)
  }
  const adminUrlFor = (url: string): string => withDatabase(server.url, new URL(url).pathname.slice(1))
  const close = async (): Promise<void> => {
    if (closed) return await closing
    closed = true
    closing = dropAll().finally(async () => {
      await server.stop()
    })
    await closing
  }
  t.teardown(close)
  const url = await createDatabase()
  return { url, adminUrl: adminUrlFor(url), source: server.source, createDatabase, adminUrlFor, close }
}
