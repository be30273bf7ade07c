// The one place that starts what the scenarios measure: one PostgreSQL, and each server on a database of its own.
import { execFile, execFileSync, spawn } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, statSync } from 'node:fs'
import { chmod, mkdir, mkdtemp, open, readFile, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import pg from 'pg'
import { freePort, startEmbeddedPostgres } from '@petstore/embedded-postgres'
import { serviceNodeFlags } from './start-command.js'

export const ROOT = fileURLToPath(new URL('..', import.meta.url))
const API_KEY = 'bench-key-0123456789abcdef'
export const AUTH = { authorization: `Bearer ${API_KEY}` }
export const LIST_PATH = '/v1/categories'
/** The last run's server logs and scratch files (bench/.tmp is ignored by git). */
export const WORK_DIR = path.join(ROOT, 'bench', '.tmp', 'run')
const START_TIMEOUT_MS = 60_000
const STOP_TIMEOUT_MS = 20_000
const POLL_MS = 100

export function numberFromEnv (name: string, fallback: number): number {
  const raw = process.env[name]
  if (raw === undefined || raw === '') return fallback
  const value = Number(raw)
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name} must be a non-negative number, got "${raw}"`)
  return value
}

export function median (values: number[]): number {
  return [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? NaN
}

export function log (message: string): void {
  process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${message}\n`)
}

export type ServerKind = 'floor' | 'ceiling' | 'naive' | 'express' | 'hono' | 'bun' | 'baseline' | 'service'
export const DATABASE_PEERS: ServerKind[] = ['naive', 'express', 'hono', 'bun']
const IN_MEMORY: ServerKind[] = ['floor', 'ceiling']

export interface Postgres {
  version: string
  /** Its CPU is counted beside the servers'. */
  postmasterPid: number
  createDatabase: (name: string, cheapCommits?: boolean) => Promise<string>
  stop: () => Promise<void>
}

/** A connection of its own, without the statement timeout the service sets on its role. */
export async function withClient<T> (url: string, use: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    await client.query('SET statement_timeout = 0')
    return await use(client)
  } finally {
    await client.end()
  }
}

export const sql = async (url: string, text: string, values: unknown[] = []): Promise<pg.QueryResult> =>
  await withClient(url, async client => await client.query(text, values))

export async function startPostgres (): Promise<Postgres> {
  await rm(WORK_DIR, { recursive: true, force: true })
  await mkdir(WORK_DIR, { recursive: true })
  const dir = await mkdtemp(path.join(tmpdir(), 'petstore-bench-'))
  // As root, embedded-postgres runs the server as a `postgres` user, which must be able to enter this directory.
  await chmod(dir, 0o755)
  const embedded = await startEmbeddedPostgres({ dir: path.join(dir, 'pg') })
  const version = String((await sql(embedded.url, 'SHOW server_version')).rows[0]?.server_version)
  return {
    version,
    postmasterPid: embedded.pid,
    createDatabase: async (label, cheapCommits = false) => {
      const name = label.replaceAll('-', '_')
      await sql(embedded.url, `CREATE DATABASE "${name}"`)
      if (cheapCommits) await sql(embedded.url, `ALTER DATABASE "${name}" SET synchronous_commit = off`)
      return embedded.urlFor(name)
    },
    stop: async () => {
      // destroy() also removes a cluster kept outside the directory (as root).
      await embedded.destroy()
      await rm(dir, { recursive: true, force: true })
    }
  }
}

export interface RunningServer {
  kind: ServerKind
  pid: number
  url: string
  /** The service's metrics endpoint (the others serve none). */
  metricsUrl: string
  stop: () => Promise<void>
}

export interface ServerOptions {
  label: string
  /** The service's node flags after npm start's own (the profiler's --cpu-prof). */
  nodeArgs?: string[]
  /** More settings for the service, e.g. tracing's OTEL_* (after BENCH_SERVICE_ENV). */
  env?: Record<string, string>
}

const PEERS = path.join(ROOT, 'bench', 'peers')

/** The peers' own dependencies (bench/peers), installed from their lockfile on first use and when it changes. */
function ensurePeers (): void {
  const installed = path.join(PEERS, 'node_modules', '.package-lock.json')
  const lockfile = path.join(PEERS, 'package-lock.json')
  if (existsSync(installed) && statSync(installed).mtimeMs >= statSync(lockfile).mtimeMs) return
  log('installing the peers\' dependencies (npm ci in bench/peers)')
  execFileSync('npm', ['ci', '--no-audit', '--no-fund'], { cwd: PEERS, stdio: ['ignore', 'ignore', 'inherit'] })
}

/** BENCH_SERVICE_ENV: space-separated NAME=value settings for the service alone (not the baseline). */
function benchServiceEnv (): Record<string, string> {
  const words = (process.env.BENCH_SERVICE_ENV ?? '').split(/\s+/).filter(word => word !== '')
  const bad = words.find(word => word.indexOf('=') <= 0)
  if (bad !== undefined) throw new Error(`BENCH_SERVICE_ENV: "${bad}" is not NAME=value`)
  return Object.fromEntries(words.map(word => [word.slice(0, word.indexOf('=')), word.slice(word.indexOf('=') + 1)]))
}

function launch (kind: ServerKind, nodeArgs: string[] = []): { command: string, args: string[], cwd: string } {
  const node = process.execPath
  const baselineDir = process.env.BENCH_BASELINE_DIR ?? ''
  switch (kind) {
    case 'service':
      return { command: node, args: [...serviceNodeFlags(), ...nodeArgs, 'dist/server.js'], cwd: ROOT }
    case 'baseline':
      if (baselineDir === '') throw new Error('the baseline server needs BENCH_BASELINE_DIR (a checkout with dist/)')
      return { command: node, args: [...serviceNodeFlags(), 'dist/server.js'], cwd: baselineDir }
    case 'bun':
      ensurePeers()
      return { command: path.join(PEERS, 'node_modules', '.bin', 'bun'), args: ['bench/peers/elysia.js'], cwd: ROOT }
    case 'express':
    case 'hono':
      ensurePeers()
      return { command: node, args: [`bench/peers/${kind}.js`], cwd: ROOT }
    default:
      return { command: node, args: ['--import', 'tsx', 'bench/fastify.ts'], cwd: ROOT }
  }
}

async function waitUntilServing (url: string, exited: () => boolean, logFile: string): Promise<void> {
  const deadline = Date.now() + START_TIMEOUT_MS
  while (Date.now() < deadline) {
    if (exited()) throw new Error(`the server exited while starting; see ${logFile}`)
    const status = await fetch(url, { headers: AUTH }).then(async response => {
      await response.arrayBuffer()
      return response.status
    }, () => 0)
    if (status === 200) return
    await new Promise(resolve => setTimeout(resolve, POLL_MS))
  }
  throw new Error(`the server did not answer within ${START_TIMEOUT_MS} ms; see ${logFile}`)
}

export async function startServer (kind: ServerKind, databaseUrl: string | undefined,
  options: ServerOptions & { rowsFile?: string }): Promise<RunningServer> {
  const port = await freePort()
  const metricsPort = await freePort()
  const url = `http://127.0.0.1:${port}`
  const logFile = path.join(WORK_DIR, `${options.label}.log`)
  const service = kind === 'service' || kind === 'baseline'
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    NODE_ENV: 'production',
    PORT: String(port),
    HOST: '127.0.0.1',
    API_KEYS: API_KEY,
    LOG_LEVEL: 'info',
    DATABASE_URL: databaseUrl,
    BENCH_FASTIFY: kind,
    BENCH_ROWS: options.rowsFile,
    // As deployed: metrics on their own port; only the drain pause on SIGTERM is skipped.
    ...service ? { METRICS_PORT: String(metricsPort), SHUTDOWN_DRAIN_MS: '0' } : {},
    ...kind === 'service' ? { ...benchServiceEnv(), ...options.env } : {}
  }
  const { command, args, cwd } = launch(kind, options.nodeArgs)
  const logHandle = await open(logFile, 'a')
  const child = spawn(command, args, { cwd, env, stdio: ['ignore', logHandle.fd, logHandle.fd] })
  const exit = once(child, 'exit')
  await logHandle.close()
  const exited = (): boolean => child.exitCode !== null || child.signalCode !== null
  try {
    // The service answers its readiness probe; a peer, its list (it has no probe).
    await waitUntilServing(`${url}${service ? '/health/ready' : LIST_PATH}`, exited, logFile)
  } catch (err) {
    child.kill('SIGKILL')
    throw err
  }
  const stop = async (): Promise<void> => {
    if (exited()) return
    child.kill('SIGTERM')
    const timer = setTimeout(() => child.kill('SIGKILL'), STOP_TIMEOUT_MS)
    await exit
    clearTimeout(timer)
  }
  return { kind, pid: child.pid as number, url, metricsUrl: `http://127.0.0.1:${metricsPort}/metrics`, stop }
}

/** The seeded rows as the API lists them: ids 1..count, a description on every other row. */
export function seedJson (count: number): string {
  const rows = Array.from({ length: count }, (_, i) => {
    const id = i + 1
    const name = `Category ${String(id).padStart(5, '0')}`
    return id % 2 === 0 ? { id, name, description: `Seeded category number ${id}` } : { id, name }
  })
  return JSON.stringify(rows)
}

/** The table of the service's first migration, for the servers that have no migrations of their own. */
const CREATE_TABLE = `CREATE TABLE categories (
  id          bigserial PRIMARY KEY,
  name        text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 255),
  description text CHECK (char_length(description) <= 2000)
)`

async function seedBySql (databaseUrl: string, count: number): Promise<void> {
  await sql(databaseUrl, `INSERT INTO categories (name, description)
    SELECT 'Category ' || lpad(i::text, greatest(5, length(i::text)), '0'),
      CASE WHEN i % 2 = 0 THEN 'Seeded category number ' || i END
    FROM generate_series(1, $1::int) AS i`, [count])
  await sql(databaseUrl, 'VACUUM ANALYZE categories')
}

/** Rows of about 113 bytes of JSON each (about 141.7 MB at 1,000,000), in a database the service has migrated. */
export async function seedLongRows (databaseUrl: string, count: number): Promise<void> {
  const migrated = await startServer('service', databaseUrl, { label: 'migrate' })
  await migrated.stop()
  await sql(databaseUrl, `INSERT INTO categories (name, description)
    SELECT 'Category ' || i, 'a category seeded for the big-list benchmark, with a description of some length ' || i
    FROM generate_series(1, $1::int) AS i`, [count])
  await sql(databaseUrl, 'VACUUM ANALYZE categories')
}

/** Deletes the rows with ids above `keep` and vacuums: a round that wrote leaves the table as it found it. */
export async function restoreTable (databaseUrl: string, keep: number): Promise<void> {
  await sql(databaseUrl, 'DELETE FROM categories WHERE id > $1', [keep])
  await sql(databaseUrl, 'VACUUM categories')
}

/** A server on its own fresh database of `rows` rows (in-memory servers: a file of them, and no database). */
export async function startSeeded (kind: ServerKind, postgres: Postgres, rows: number,
  options: ServerOptions & { cheapCommits?: boolean }): Promise<{ server: RunningServer, databaseUrl: string }> {
  if (IN_MEMORY.includes(kind)) {
    const rowsFile = path.join(WORK_DIR, `rows-${rows}.json`)
    await writeFile(rowsFile, seedJson(rows))
    return { server: await startServer(kind, undefined, { ...options, rowsFile }), databaseUrl: '' }
  }
  const databaseUrl = await postgres.createDatabase(options.label, options.cheapCommits)
  if (DATABASE_PEERS.includes(kind)) await sql(databaseUrl, CREATE_TABLE)
  const server = await startServer(kind, databaseUrl, options)
  try {
    await seedBySql(databaseUrl, rows)
  } catch (err) {
    await server.stop()
    throw err
  }
  return { server, databaseUrl }
}

export async function readMetric (server: RunningServer, name: string): Promise<Map<string, number>> {
  const text = await fetch(server.metricsUrl).then(async response => await response.text(), () => '')
  const samples = new Map<string, number>()
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue
    const at = line.lastIndexOf(' ')
    samples.set(line.slice(name.length, at), Number(line.slice(at + 1)))
  }
  return samples
}

export const metricTotal = async (server: RunningServer, name: string): Promise<number> =>
  [...(await readMetric(server, name)).values()].reduce((total, value) => total + value, 0)

/** One GET of the list, asked without Accept-Encoding as wrk asks (the compressed list's tag would never match). */
export async function getList (url: string): Promise<{ status: number, bytes: number, etag: string }> {
  const response = await fetch(`${url}${LIST_PATH}`, { headers: { ...AUTH, 'accept-encoding': 'identity' } })
  const bytes = (await response.arrayBuffer()).byteLength
  return { status: response.status, bytes, etag: response.headers.get('etag') ?? '"no tag was sent"' }
}

/** One write by fetch; an answer other than 2xx throws. */
export async function send (url: string, method: string, body?: object): Promise<void> {
  const contentType = method === 'PATCH' ? 'application/merge-patch+json' : 'application/json'
  const headers = body === undefined ? AUTH : { ...AUTH, 'content-type': contentType }
  const response = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) })
  await response.arrayBuffer()
  if (response.status >= 300) throw new Error(`${method} ${url} answered ${response.status}`)
}

export interface Transfer { status: number, bytes: number, firstByteMs: number, totalMs: number }

/**
 * One GET by curl, its body dropped (or written to `output`); the key goes on curl's stdin, never its command line.
 * Node's fetch needs seconds for a body curl reads in a tenth of one (docs/performance.md).
 */
export async function curlGet (url: string, headers: Record<string, string> = {}, output = '/dev/null'):
Promise<Transfer> {
  const lines = Object.entries({ ...AUTH, ...headers }).map(([name, value]) => `header = "${name}: ${value}"\n`)
  const format = '%{http_code} %{size_download} %{time_starttransfer} %{time_total}'
  const child = promisify(execFile)('curl', ['-s', '-K', '-', '-o', output, '-w', format, url], { encoding: 'utf8' })
  child.child.stdin?.end(lines.join(''))
  const [status = 0, bytes = 0, firstByte = 0, total = 0] = (await child).stdout.split(' ').map(Number)
  return { status, bytes, firstByteMs: firstByte * 1000, totalMs: total * 1000 }
}

/** The body of one GET by curl, through a file. */
export async function curlBody (url: string, headers: Record<string, string> = {}): Promise<Buffer> {
  const file = path.join(WORK_DIR, 'body')
  await curlGet(url, headers, file)
  const body = await readFile(file)
  await rm(file)
  return body
}
