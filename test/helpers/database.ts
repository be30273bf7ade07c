import { randomBytes } from 'node:crypto'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import pg from 'pg'
import { startEmbeddedPostgres } from '../../src/db/embedded.js'

/**
 * A PostgreSQL database of this test file's own, from (in order): DATABASE_URL's
 * server; a testcontainers PostgreSQL when a container runtime answers; the
 * embedded PostgreSQL. Dropped (or stopped) when the file's tests end.
 */
export interface TestDatabase {
  url: string
  /** Where it came from, for the test output. */
  source: 'DATABASE_URL' | 'testcontainers' | 'embedded'
  /** Creates one more empty database on the same server (for tests that need two). */
  createDatabase: () => Promise<string>
  close: () => Promise<void>
}

interface Teardown { teardown: (fn: () => Promise<void> | void) => void }

function withDatabase (serverUrl: string, database: string): string {
  const url = new URL(serverUrl)
  url.pathname = `/${database}`
  return url.toString()
}

async function createOn (serverUrl: string): Promise<string> {
  const name = `petstore_test_${randomBytes(6).toString('hex')}`
  const admin = new pg.Client({ connectionString: serverUrl })
  await admin.connect()
  try {
    await admin.query(`CREATE DATABASE ${name}`)
  } finally {
    await admin.end()
  }
  return name
}

async function dropOn (serverUrl: string, names: string[]): Promise<void> {
  const admin = new pg.Client({ connectionString: serverUrl })
  await admin.connect()
  try {
    for (const name of names) await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
  } finally {
    await admin.end()
  }
}

/** A server-level URL plus a way to stop the server (if we started it). */
async function startServer (): Promise<{ serverUrl: string, source: TestDatabase['source'], stop: () => Promise<void> }> {
  const fromEnv = process.env.DATABASE_URL
  if (fromEnv !== undefined && fromEnv !== '') {
    return { serverUrl: fromEnv, source: 'DATABASE_URL', stop: async () => {} }
  }
  if (process.env.PETSTORE_TEST_NO_CONTAINERS !== '1') {
    try {
      const { getContainerRuntimeClient } = await import('testcontainers')
      await getContainerRuntimeClient()
      const { PostgreSqlContainer } = await import('@testcontainers/postgresql')
      const container = await new PostgreSqlContainer('postgres:18-alpine').start()
      return { serverUrl: container.getConnectionUri(), source: 'testcontainers', stop: async () => { await container.stop() } }
    } catch {
      // No container runtime here: fall through to the embedded server.
    }
  }
  const dir = await mkdtemp(path.join(tmpdir(), 'petstore-test-pg-'))
  const embedded = await startEmbeddedPostgres({ dir })
  return {
    serverUrl: embedded.url,
    source: 'embedded',
    stop: async () => {
      await embedded.stop()
      await rm(dir, { recursive: true, force: true })
    }
  }
}

export async function testDatabase (t: Teardown): Promise<TestDatabase> {
  const server = await startServer()
  const created: string[] = []
  const createDatabase = async (): Promise<string> => {
    const name = await createOn(server.serverUrl)
    created.push(name)
    return withDatabase(server.serverUrl, name)
  }
  const url = await createDatabase()
  let closed = false
  const close = async (): Promise<void> => {
    if (closed) return
    closed = true
    if (server.source === 'DATABASE_URL') await dropOn(server.serverUrl, created)
    await server.stop()
  }
  t.teardown(close)
  return { url, source: server.source, createDatabase, close }
}
