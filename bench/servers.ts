/*
 * The one place that starts what the scenarios measure: one PostgreSQL (DATABASE_URL, or the embedded one in a
 * temporary directory), a fresh database per server, each server in its own process with its log in a file.
 */
import { execFile, execFileSync, spawn } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, statSync } from 'node:fs'
import { chmod, mkdtemp, open, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { finished } from 'node:stream/promises'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import pg from 'pg'
import { to as copyTo } from 'pg-copy-streams'
import { freePort, startEmbeddedPostgres } from '@petstore/embedded-postgres'
import { benchServiceNodeArgs } from './start-command.js'

export const ROOT = fileURLToPath(new URL('..', import.meta.url))
const API_KEY = 'bench-key-0123456789abcdef'
export const AUTH = { authorization: `Bearer ${API_KEY}` }
export const LIST_PATH = '/v1/categories'
const START_TIMEOUT_MS = 60_000
const STOP_TIMEOUT_MS = 20_000
const POLL_MS = 100

/** A non-negative number from the environment, or the fallback when unset. */
export function numberFromEnv (name: string, fallback: number): number {
  const raw = process.env[name]
  if (raw === undefined || raw === '') return fallback
  const value = Number(raw)
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name} must be a non-negative number, got "${raw}"`)
  return value
}

/** The middle value (the upper of the two middle ones); NaN for none. */
export function median (values: number[]): number {
  return [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? NaN
}

export function log (message: string): void {
  process.stderr.write(`[bench ${new Date().toISOString().slice(11, 19)}] ${message}\n`)
}

/**
 * floor: Fastify sending a fixed Buffer behind @fastify/bearer-auth; ceiling: Fastify serializing an in-memory
 * list; naive: Fastify + pg; express, hono, bun: bench/peers; service: npm start; baseline: the service built in
 * BENCH_BASELINE_DIR, for a before and after in one run.
 */
export type ServerKind = 'floor' | 'ceiling' | 'naive' | 'express' | 'hono' | 'bun' | 'baseline' | 'service'
export const DATABASE_PEERS: ServerKind[] = ['naive', 'express', 'hono', 'bun']
export const IN_MEMORY: ServerKind[] = ['floor', 'ceiling']

export interface Postgres {
  workDir: string
  version: string
  source: string
  /** The postmaster's pid when the bench started it (its CPU is counted), else undefined. */
  postmasterPid: number | undefined
  /** An empty database; with cheapCommits, `synchronous_commit = off` for every session in it. */
  createDatabase: (name: string, options?: { cheapCommits?: boolean }) => Promise<string>
  stop: () => Promise<void>
}

/** One statement on its own connection, without the statement timeout the service sets on its role. */
export async function sql (url: string, text: string, values: unknown[] = []): Promise<pg.QueryResult> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try {
    await client.query('SET statement_timeout = 0')
    return await client.query(text, values)
  } finally {
    await client.end()
  }
}

export async function startPostgres (): Promise<Postgres> {
  const keep = process.env.BENCH_KEEP === '1'
  const workDir = await mkdtemp(path.join(tmpdir(), 'petstore-bench-'))
  // As root, embedded-postgres runs the server as a `postgres` user, which must be able to enter this directory.
  await chmod(workDir, 0o755)
  const shared = process.env.DATABASE_URL ?? ''
  const embedded = shared === '' ? await startEmbeddedPostgres({ dir: path.join(workDir, 'pg') }) : undefined
  const adminUrl = embedded?.url ?? shared
  const urlFor = (name: string): string => {
    const url = new URL(adminUrl)
    url.pathname = `/${name}`
    return url.toString()
  }
  const created: string[] = []
  return {
    workDir,
    version: String((await sql(adminUrl, 'SHOW server_version')).rows[0]?.server_version),
    source: embedded === undefined ? 'DATABASE_URL' : 'embedded PostgreSQL (packages/embedded-postgres)',
    postmasterPid: embedded?.pid,
    createDatabase: async (name, options = {}) => {
      await sql(adminUrl, `DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`)
      await sql(adminUrl, `CREATE DATABASE "${name}"`)
      if (options.cheapCommits === true) await sql(adminUrl, `ALTER DATABASE "${name}" SET synchronous_commit = off`)
      created.push(name)
      return urlFor(name)
    },
    stop: async () => {
      for (const name of embedded === undefined ? created : []) {
        await sql(adminUrl, `DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`).catch(() => {})
      }
      // destroy() also removes a cluster kept outside workDir (as root); BENCH_KEEP keeps it and the logs.
      if (embedded !== undefined) await (keep ? embedded.stop() : embedded.destroy())
      if (!keep) await rm(workDir, { recursive: true, force: true })
    }
  }
}

export interface RunningServer {
  kind: ServerKind
  pid: number
  url: string
  /** The service's metrics endpoint (the others serve none). */
  metricsUrl: string
  logFile: string
  stop: () => Promise<void>
}

export interface ServerOptions {
  label: string
  workDir: string
  databaseUrl?: string
  /** A JSON file of the rows, for the in-memory servers. */
  rowsFile?: string
  /** Extra node flags (the profiler's --cpu-prof); for the service after npm start's own. */
  nodeArgs?: string[]
  /** More settings for the service, e.g. tracing's OTEL_* (after BENCH_SERVICE_ENV). */
  env?: Record<string, string>
}

const PEERS = path.join(ROOT, 'bench', 'peers')
const BUN = path.join(PEERS, 'node_modules', '.bin', 'bun')

/** The peers' own dependencies (bench/peers), installed from their lockfile on first use and when it changes. */
export function ensurePeers (): void {
  const installed = path.join(PEERS, 'node_modules', '.package-lock.json')
  const lockfile = path.join(PEERS, 'package-lock.json')
  if (existsSync(installed) && statSync(installed).mtimeMs >= statSync(lockfile).mtimeMs) return
  log('installing the peers\' dependencies (npm ci in bench/peers)')
  execFileSync('npm', ['ci', '--no-audit', '--no-fund'], { cwd: PEERS, stdio: ['ignore', 'ignore', 'inherit'] })
}

/** BENCH_SERVICE_ENV: space-separated NAME=value settings for the service alone (not the baseline). */
function benchServiceEnv (value = process.env.BENCH_SERVICE_ENV ?? ''): Record<string, string> {
  const settings: Record<string, string> = {}
  for (const item of value.split(/\s+/).filter(word => word !== '')) {
    const at = item.indexOf('=')
    if (at <= 0) throw new Error(`BENCH_SERVICE_ENV: "${item}" is not NAME=value`)
    settings[item.slice(0, at)] = item.slice(at + 1)
  }
  return settings
}

interface Launch { command: string, args: string[], env: Record<string, string>, cwd: string }

function launch (kind: ServerKind, metricsPort: number, options: ServerOptions): Launch {
  const nodeArgs = options.nodeArgs ?? []
  const production = { NODE_ENV: 'production' }
  const tsx = (file: string): string[] => [...nodeArgs, '--import', 'tsx', file]
  switch (kind) {
    case 'service':
    case 'baseline': {
      const cwd = kind === 'service' ? ROOT : process.env.BENCH_BASELINE_DIR ?? ''
      if (cwd === '') throw new Error('the baseline server needs BENCH_BASELINE_DIR (a checkout with dist/ built)')
      const own = kind === 'service' ? { ...benchServiceEnv(), ...options.env } : {}
      // As deployed: production, metrics on their own port; only the drain pause on SIGTERM is skipped.
      const env = { ...production, METRICS_PORT: String(metricsPort), SHUTDOWN_DRAIN_MS: '0', ...own }
      return { command: process.execPath, args: [...benchServiceNodeArgs(), ...nodeArgs, 'dist/server.js'], env, cwd }
    }
    case 'floor':
    case 'ceiling': {
      const body: Record<string, string> = kind === 'floor' ? { CEILING_BODY: 'buffer' } : {}
      return { command: process.execPath, args: tsx('bench/ceiling.ts'), env: { ...production, ...body }, cwd: ROOT }
    }
    case 'naive':
      return { command: process.execPath, args: tsx('bench/naive.ts'), env: production, cwd: ROOT }
    case 'express':
    case 'hono':
      return { command: process.execPath, args: [...nodeArgs, `bench/peers/${kind}.js`], env: production, cwd: ROOT }
    case 'bun':
      return { command: BUN, args: ['bench/peers/elysia.js'], env: production, cwd: ROOT }
  }
}

/** The service answers its readiness probe; a peer, its list (it has no probe). */
const readyPath = (kind: ServerKind): string => kind === 'service' || kind === 'baseline' ? '/health/ready' : LIST_PATH

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

/** Starts one server in its own process, stdout and stderr in a log file, and waits until it answers. */
export async function startServer (kind: ServerKind, options: ServerOptions): Promise<RunningServer> {
  const port = await freePort()
  const metricsPort = await freePort()
  const url = `http://127.0.0.1:${port}`
  const logFile = path.join(options.workDir, `${options.label}.log`)
  const how = launch(kind, metricsPort, options)
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    PORT: String(port),
    HOST: '127.0.0.1',
    API_KEYS: API_KEY,
    LOG_LEVEL: 'info',
    DB_POOL_MAX: process.env.DB_POOL_MAX,
    DATABASE_URL: options.databaseUrl,
    CEILING_DATA: options.rowsFile,
    ...how.env
  }
  const logHandle = await open(logFile, 'a')
  const child = spawn(how.command, how.args, { cwd: how.cwd, env, stdio: ['ignore', logHandle.fd, logHandle.fd] })
  const exit = once(child, 'exit')
  await logHandle.close()
  const exited = (): boolean => child.exitCode !== null || child.signalCode !== null
  try {
    await waitUntilServing(`${url}${readyPath(kind)}`, exited, logFile)
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
  return { kind, pid: child.pid as number, url, metricsUrl: `http://127.0.0.1:${metricsPort}/metrics`, logFile, stop }
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

/** The rows of seedJson, written by SQL into a server's own table (empty, or grown by `count` rows). */
export async function seedBySql (databaseUrl: string, count: number): Promise<void> {
  await sql(databaseUrl, `INSERT INTO categories (name, description)
    SELECT 'Category ' || lpad(i::text, greatest(5, length(i::text)), '0'),
      CASE WHEN i % 2 = 0 THEN 'Seeded category number ' || i END
    FROM generate_series(1, $1::int) AS i`, [count])
  await sql(databaseUrl, 'VACUUM ANALYZE categories')
}

const LONG_DESCRIPTION = 'a category seeded for the big-list benchmark, with a description of some length'

/** Rows of about 113 bytes of JSON each (about 141.7 MB at 1,000,000); returns the list's byte length. */
export async function seedLongRows (databaseUrl: string, count: number): Promise<number> {
  await sql(databaseUrl, `INSERT INTO categories (name, description)
    SELECT 'Category ' || i, $2 || ' ' || i FROM generate_series(1, $1::int) AS i`, [count, LONG_DESCRIPTION])
  await sql(databaseUrl, 'VACUUM ANALYZE categories')
  let bytes = 1
  for (let id = 1; id <= count; id++) {
    const row = { id, name: `Category ${id}`, description: `${LONG_DESCRIPTION} ${id}` }
    bytes += Buffer.byteLength(JSON.stringify(row)) + 1
  }
  return bytes
}

/** Deletes the rows with ids above `keep` and vacuums: a round that wrote leaves the table as it found it. */
export async function restoreTable (databaseUrl: string, keep: number): Promise<number> {
  const { rowCount } = await sql(databaseUrl, 'DELETE FROM categories WHERE id > $1', [keep])
  await sql(databaseUrl, 'VACUUM categories')
  return rowCount ?? 0
}

interface SeededOptions {
  label: string
  database: string
  cheapCommits?: boolean
  nodeArgs?: string[]
  env?: Record<string, string>
}

/** A server on its own fresh database of `rows` rows (in-memory servers: a file of them, and no database URL). */
export async function startSeeded (kind: ServerKind, postgres: Postgres, rows: number, options: SeededOptions):
Promise<{ server: RunningServer, databaseUrl: string | undefined }> {
  const common = { label: options.label, workDir: postgres.workDir, nodeArgs: options.nodeArgs, env: options.env }
  if (IN_MEMORY.includes(kind)) {
    const rowsFile = path.join(postgres.workDir, `rows-${rows}.json`)
    await writeFile(rowsFile, seedJson(rows))
    return { server: await startServer(kind, { ...common, rowsFile }), databaseUrl: undefined }
  }
  const databaseUrl = await postgres.createDatabase(options.database, { cheapCommits: options.cheapCommits })
  const server = await startServer(kind, { ...common, databaseUrl })
  try {
    await seedBySql(databaseUrl, rows)
  } catch (err) {
    await server.stop()
    throw err
  }
  return { server, databaseUrl }
}

/** PostgreSQL's own pace: `COPY … TO STDOUT` of the categories, read and dropped; milliseconds. */
export async function copyMs (databaseUrl: string): Promise<number> {
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  try {
    await client.query('SET statement_timeout = 0')
    const started = performance.now()
    const stream = client.query(copyTo('COPY (SELECT id, name, description FROM categories ORDER BY id) TO STDOUT'))
    stream.resume()
    await finished(stream)
    return performance.now() - started
  } finally {
    await client.end()
  }
}

/** A sample of one metric from a server's metrics endpoint, by its labels as written (`{source="cache"}`). */
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

/** Every sample of a metric added up. */
export async function metricTotal (server: RunningServer, name: string): Promise<number> {
  let total = 0
  for (const value of (await readMetric(server, name)).values()) total += value
  return total
}

/** What changed in a metric between two readings, by labels. */
export function growth (after: Map<string, number>, before: Map<string, number>): Map<string, number> {
  return new Map([...after].map(([labels, value]) => [labels, value - (before.get(labels) ?? 0)]))
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
  const [status, bytes, firstByte, total] = (await child).stdout.split(' ').map(Number)
  return { status: status ?? 0, bytes: bytes ?? 0, firstByteMs: (firstByte ?? 0) * 1000, totalMs: (total ?? 0) * 1000 }
}
