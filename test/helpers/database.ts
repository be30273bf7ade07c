import { randomBytes } from 'node:crypto'
import { withClient } from './pg-client.js'
import { chooseSource, describeChoice, startPostgresServer, type DatabaseSource, type PostgresServer } from './postgres-server.js'

/**
 * A PostgreSQL database of this test file's own, dropped when the file's tests end.
 * Under `npm test` it lives on the run's one server (scripts/run-tests.ts passes it in
 * TEST_DATABASE_SERVER_URL); a file run on its own (`npx tap test/x.test.ts`) starts a
 * server of its own, chosen the same way (test/helpers/postgres-server.ts), and says which.
 */
export interface TestDatabase {
  url: string
  /** Where its server came from. */
  source: DatabaseSource
  /** Creates one more empty database on the same server (for tests that need two). */
  createDatabase: () => Promise<string>
  close: () => Promise<void>
}

interface Teardown {
  teardown: (fn: () => Promise<void> | void) => void
  comment: (...message: unknown[]) => void
}

/** Set by scripts/run-tests.ts for the test processes: the run's server and its source. */
export const SERVER_URL_VARIABLE = 'TEST_DATABASE_SERVER_URL'
export const SERVER_SOURCE_VARIABLE = 'TEST_DATABASE_SERVER_SOURCE'

function withDatabase (serverUrl: string, database: string): string {
  const url = new URL(serverUrl)
  url.pathname = `/${database}`
  return url.toString()
}

async function onServer (serverUrl: string, sql: string[]): Promise<void> {
  await withClient(serverUrl, async admin => { for (const statement of sql) await admin.query(statement) })
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
  const created: string[] = []
  const createDatabase = async (): Promise<string> => {
    const name = `petstore_test_${randomBytes(6).toString('hex')}`
    await onServer(server.url, [`CREATE DATABASE ${name}`])
    if (closed) {
      // The teardown has run: nothing would drop it. A file that awaits testDatabase(t) after starting a
      // subtest can end before it resolves, and tap then drops its later subtests without a failure.
      const error = new Error(`${name}: the test ended before its database was ready: await testDatabase(t) before the file's first subtest`)
      // On a server of this file's own, the teardown stops it, and the database goes with it.
      await onServer(server.url, [`DROP DATABASE ${name}`]).catch((err: Error) => { error.message += ` (and dropping it failed: ${err.message})` })
      throw error
    }
    created.push(name)
    return withDatabase(server.url, name)
  }
  let closed = false
  const close = async (): Promise<void> => {
    if (closed) return
    closed = true
    try {
      await onServer(server.url, created.map(name => `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`))
    } finally {
      await server.stop()
    }
  }
  t.teardown(close)
  const url = await createDatabase()
  return { url, source: server.source, createDatabase, close }
}
