/*
 * What the benchmark and the soak start: one PostgreSQL (DATABASE_URL, or the
 * embedded one in a temporary directory), a fresh database per server, each
 * server in its own child process, and the load generator in another.
 */
import { execFileSync, fork, spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { existsSync, statSync } from 'node:fs'
import { chmod, mkdtemp, open, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { finished } from 'node:stream/promises'
import { fileURLToPath } from 'node:url'
import pg from 'pg'
import { to as copyTo } from 'pg-copy-streams'
import { freePort, startEmbeddedPostgres } from '@petstore/embedded-postgres'
import type { LoadMessage, LoadResult, LoadSpec } from './load.js'
import { benchServiceNodeArgs } from './start-command.js'
import { ensureWrk, wrkLoadGenerator } from './wrk.js'

export const ROOT = fileURLToPath(new URL('..', import.meta.url))
export const API_KEY = 'bench-key-0123456789abcdef'
export const AUTH = { authorization: `Bearer ${API_KEY}` }

/** A non-negative number from the environment (benchmark settings), or the fallback when unset. */
export function numberFromEnv (name: string, fallback: number): number {
  const raw = process.env[name]
  if (raw === undefined || raw === '') return fallback
  const value = Number(raw)
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name} must be a non-negative number, got "${raw}"`)
  return value
}

/**
 * raw: node:http alone (the limit); floor: Fastify sending a cached Buffer, no hooks; ceiling: Fastify
 * serializing an in-memory list; naive: Fastify + pg; express: Express + pg; hono: Hono + postgres.js
 * on Node; bun: Elysia + Bun.SQL on Bun; service: npm start; baseline: the service built in
 * BENCH_BASELINE_DIR (another checkout), for before/after ratios in one run.
 */
export type ServerKind = 'raw' | 'floor' | 'ceiling' | 'naive' | 'express' | 'hono' | 'bun' | 'baseline' | 'service'

/** Servers that read and write PostgreSQL (the service's peers). */
export const DATABASE_PEERS: ServerKind[] = ['naive', 'express', 'hono', 'bun']
/** Servers that serve the rows from memory (CEILING_DATA) instead of a database. */
export const IN_MEMORY: ServerKind[] = ['raw', 'floor', 'ceiling']

export interface Postgres {
  /** Where the temporary files (logs, ceiling data, embedded data) live. */
  workDir: string
  version: string
  source: string
  /** The postmaster's pid when we started the server (for its CPU time). */
  postmasterPid: number | undefined
  /** Creates an empty database (each server makes its own table); returns its URL. */
  createDatabase: (name: string) => Promise<string>
  stop: () => Promise<void>
}

async function adminQuery (url: string, sql: string): Promise<pg.QueryResult> {
  const client = new pg.Client({ connectionString: url })
  await client.connect()
  try { return await client.query(sql) } finally { await client.end() }
}

export async function startPostgres (): Promise<Postgres> {
  const workDir = await mkdtemp(path.join(tmpdir(), 'petstore-bench-'))
  // As root, embedded-postgres runs the server as a `postgres` user, which must be able to enter this directory.
  await chmod(workDir, 0o755)
  let adminUrl = process.env.DATABASE_URL
  let urlFor: (db: string) => string
  let stopEmbedded = async (): Promise<void> => {}
  let source: string
  let postmasterPid: number | undefined
  if (adminUrl === undefined || adminUrl === '') {
    const embedded = await startEmbeddedPostgres({ dir: path.join(workDir, 'pg') }).catch(async (err: unknown) => {
      await rm(workDir, { recursive: true, force: true })
      throw err
    })
    adminUrl = embedded.url
    urlFor = embedded.urlFor
    // destroy() also removes a cluster that lives outside workDir (as root, packages/embedded-postgres puts it where its `postgres` user can reach); BENCH_KEEP keeps it.
    stopEmbedded = process.env.BENCH_KEEP === '1' ? embedded.stop : embedded.destroy
    source = 'embedded PostgreSQL (packages/embedded-postgres) in a temporary directory'
    postmasterPid = embedded.pid
  } else {
    const base = adminUrl
    urlFor = (db) => { const u = new URL(base); u.pathname = `/${db}`; return u.toString() }
    source = 'DATABASE_URL'
  }
  const version = String((await adminQuery(adminUrl, 'SHOW server_version')).rows[0]?.server_version)
  const created: string[] = []
  return {
    workDir,
    version,
    source,
    postmasterPid,
    createDatabase: async (name) => {
      await adminQuery(adminUrl, `DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`)
      await adminQuery(adminUrl, `CREATE DATABASE "${name}"`)
      created.push(name)
      return urlFor(name)
    },
    stop: async () => {
      // On a shared DATABASE_URL, leave nothing behind; the embedded server goes with its cluster.
      if (process.env.DATABASE_URL !== undefined && process.env.DATABASE_URL !== '') {
        for (const name of created) await adminQuery(adminUrl, `DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`).catch(() => {})
      }
      await stopEmbedded()
      if (process.env.BENCH_KEEP !== '1') await rm(workDir, { recursive: true, force: true })
    }
  }
}

export interface RunningServer {
  kind: ServerKind
  pid: number
  url: string
  /** The service's (and baseline's) metrics endpoint; the others serve none there. */
  metricsUrl: string
  logFile: string
  stop: () => Promise<void>
}

export interface ServerOptions {
  databaseUrl?: string
  ceilingData?: string
  logLevel: string
  workDir: string
  label: string
  /** Extra node flags (bench/profile.ts: --cpu-prof); for the service they come after npm start's. */
  nodeArgs?: string[]
}

async function waitUntilServing (url: string, child: ChildProcess, logFile: string): Promise<void> {
  const deadline = Date.now() + 60_000
  while (Date.now() < deadline) {
    if (child.exitCode !== null || child.signalCode !== null) throw new Error(`server exited during start (${child.exitCode ?? child.signalCode}); see ${logFile}`)
    try {
      const response = await fetch(`${url}/v1/categories`, { headers: AUTH })
      await response.arrayBuffer()
      if (response.status === 200) return
    } catch { /* not listening yet */ }
    await new Promise(resolve => setTimeout(resolve, 100))
  }
  throw new Error(`server did not answer within 60 s; see ${logFile}`)
}

/** How a server is started: its command, arguments, environment and directory. */
interface Launch { command: string, args: string[], env: NodeJS.ProcessEnv, cwd?: string }

const PEERS = path.join(ROOT, 'bench', 'peers')
const BUN = path.join(PEERS, 'node_modules', '.bin', 'bun')

/** The peers' own dependencies (bench/peers/package.json), installed from their lockfile on first use and when it changes. */
export function ensurePeers (log: (message: string) => void): void {
  const installed = path.join(PEERS, 'node_modules', '.package-lock.json')
  if (existsSync(installed) && statSync(installed).mtimeMs >= statSync(path.join(PEERS, 'package-lock.json')).mtimeMs) return
  log('installing the peers\' dependencies (npm ci in bench/peers)')
  execFileSync('npm', ['ci', '--no-audit', '--no-fund'], { cwd: PEERS, stdio: ['ignore', 'ignore', 'inherit'] })
}

/** The Bun version the peers run on, for the report. */
export function bunVersion (): string {
  try { return execFileSync(BUN, ['--version'], { encoding: 'utf8' }).trim() } catch { return 'not installed' }
}

/**
 * BENCH_SERVICE_ENV: more settings for the service alone (not the baseline), as space-separated
 * NAME=value: with BENCH_BASELINE_DIR at this checkout, one setting's cost in one run (tracing on against off).
 */
export function benchServiceEnv (value = process.env.BENCH_SERVICE_ENV ?? ''): Record<string, string> {
  return Object.fromEntries(value.split(/\s+/).filter(item => item !== '').map(item => {
    const at = item.indexOf('=')
    if (at <= 0) throw new Error(`BENCH_SERVICE_ENV: "${item}" is not NAME=value`)
    return [item.slice(0, at), item.slice(at + 1)]
  }))
}

function launch (kind: ServerKind, metricsPort: number, nodeArgs: string[]): Launch {
  switch (kind) {
    case 'service':
    case 'baseline': {
      const cwd = kind === 'service' ? ROOT : process.env.BENCH_BASELINE_DIR
      if (cwd === undefined || cwd === '') throw new Error('the baseline server needs BENCH_BASELINE_DIR (a checkout with dist/ built)')
      // Production mode, metrics on (their own port, as deployed); only the drain pause on SIGTERM is skipped (it slows teardown).
      return { command: process.execPath, args: [...benchServiceNodeArgs(), ...nodeArgs, 'dist/server.js'], env: { NODE_ENV: 'production', METRICS_PORT: String(metricsPort), SHUTDOWN_DRAIN_MS: '0', ...(kind === 'service' ? benchServiceEnv() : {}) }, cwd }
    }
    case 'floor':
      return { command: process.execPath, args: [...nodeArgs, '--import', 'tsx', 'bench/ceiling.ts'], env: { NODE_ENV: 'production', CEILING_BODY: 'buffer' } }
    case 'raw':
    case 'ceiling':
    case 'naive':
      return { command: process.execPath, args: [...nodeArgs, '--import', 'tsx', `bench/${kind}.ts`], env: { NODE_ENV: 'production' } }
    case 'express':
    case 'hono':
      return { command: process.execPath, args: [...nodeArgs, `bench/peers/${kind}.js`], env: { NODE_ENV: 'production' } }
    case 'bun':
      return { command: BUN, args: ['bench/peers/elysia.js'], env: { NODE_ENV: 'production' } }
  }
}

/** Starts one server in its own process, its stdout and stderr in a log file, and waits until it answers. */
export async function startServer (kind: ServerKind, options: ServerOptions): Promise<RunningServer> {
  const port = await freePort()
  const url = `http://127.0.0.1:${port}`
  const logFile = path.join(options.workDir, `${options.label}.log`)
  const log = await open(logFile, 'a')
  const metricsPort = await freePort()
  const how = launch(kind, metricsPort, options.nodeArgs ?? [])
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    PORT: String(port),
    HOST: '127.0.0.1',
    API_KEYS: API_KEY,
    LOG_LEVEL: options.logLevel,
    ...(process.env.DB_POOL_MAX === undefined ? {} : { DB_POOL_MAX: process.env.DB_POOL_MAX }),
    ...(process.env.DB_PREPARED_STATEMENTS === undefined ? {} : { DB_PREPARED_STATEMENTS: process.env.DB_PREPARED_STATEMENTS }),
    ...(options.databaseUrl === undefined ? {} : { DATABASE_URL: options.databaseUrl }),
    ...(options.ceilingData === undefined ? {} : { CEILING_DATA: options.ceilingData }),
    ...how.env
  }
  const child = spawn(how.command, how.args, { cwd: how.cwd ?? ROOT, env, stdio: ['ignore', log.fd, log.fd] })
  const exited = once(child, 'exit')
  await log.close()
  if (child.pid === undefined) throw new Error(`could not start ${kind}`)
  try {
    await waitUntilServing(url, child, logFile)
  } catch (err) {
    child.kill('SIGKILL')
    throw err
  }
  return {
    kind,
    pid: child.pid,
    url,
    metricsUrl: `http://127.0.0.1:${metricsPort}/metrics`,
    logFile,
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return
      child.kill('SIGTERM')
      const timer = setTimeout(() => child.kill('SIGKILL'), 20_000)
      await exited
      clearTimeout(timer)
    }
  }
}

export interface LoadGenerator {
  /** wrk or autocannon */
  name: string
  /** Runs one scenario; onMeasuring is called when the warm-up is over and the measured window begins. */
  run: (spec: LoadSpec, onMeasuring: () => void) => Promise<LoadResult>
  stop: () => Promise<void>
}

/** BENCH_LOAD: wrk (default) or autocannon (the soak's, which needs a steady rate wrk cannot hold). */
export async function startLoadGenerator (log: (message: string) => void, which = process.env.BENCH_LOAD ?? 'wrk'): Promise<LoadGenerator> {
  if (which === 'wrk') {
    log(ensureWrk(log))
    return wrkLoadGenerator()
  }
  if (which !== 'autocannon') throw new Error(`BENCH_LOAD must be wrk or autocannon, got "${which}"`)
  return startAutocannon()
}

async function startAutocannon (): Promise<LoadGenerator> {
  const child = fork(path.join(ROOT, 'bench/load.ts'), [], { cwd: ROOT, execArgv: ['--import', 'tsx'], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  const exited = once(child, 'exit')
  if (child.pid === undefined) throw new Error('could not start the load generator')
  return {
    name: 'autocannon',
    run: async (spec, onMeasuring) => await new Promise((resolve, reject) => {
      const onMessage = (message: LoadMessage): void => {
        if (message.type === 'measuring') { onMeasuring(); return }
        child.off('message', onMessage)
        child.off('exit', onExit)
        if (message.type === 'result') resolve(message.result)
        else reject(new Error(`load generator: ${message.message}`))
      }
      const onExit = (): void => { reject(new Error('load generator exited')) }
      child.on('message', onMessage)
      child.once('exit', onExit)
      child.send(spec)
    }),
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return
      child.disconnect()
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000)
      await exited
      clearTimeout(timer)
    }
  }
}

export interface SeedRow { id: number, name: string, description?: string }

/** The rows every server holds before a phase: ids 1..count, a description on every other row. */
export function seedRows (count: number): SeedRow[] {
  return Array.from({ length: count }, (_, i) => {
    const id = i + 1
    const name = `Category ${String(id).padStart(5, '0')}`
    return id % 2 === 0 ? { id, name, description: `Seeded category number ${id}` } : { id, name }
  })
}

/** Creates the rows through the API (POST), a few requests at a time. */
export async function seedThroughApi (url: string, rows: SeedRow[], concurrency = 32): Promise<void> {
  let next = 0
  const worker = async (): Promise<void> => {
    while (next < rows.length) {
      const { id: _id, ...body } = rows[next++] as SeedRow
      const response = await fetch(`${url}/v1/categories`, {
        method: 'POST',
        headers: { ...AUTH, 'content-type': 'application/json' },
        body: JSON.stringify(body)
      })
      const text = await response.text()
      if (response.status !== 201) throw new Error(`seeding ${url}: POST answered ${response.status}: ${text}`)
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker))
}

/** Runs one bulk INSERT into a server's own categories table, then VACUUM ANALYZE. */
async function bulkInsert (databaseUrl: string, insert: string, values: unknown[]): Promise<void> {
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  try {
    // The service set its statement timeout on the role (migrations); a bulk load needs longer.
    await client.query('SET statement_timeout = 0')
    await client.query(insert, values)
    await client.query('VACUUM ANALYZE categories')
  } finally {
    await client.end()
  }
}

/** The rows of seedRows, written by SQL into a server's own table: for the large tables, where POSTs would take minutes. */
export async function seedBySql (databaseUrl: string, rows: number): Promise<void> {
  await bulkInsert(databaseUrl, `INSERT INTO categories (name, description)
    SELECT 'Category ' || lpad(i::text, greatest(5, length(i::text)), '0'), CASE WHEN i % 2 = 0 THEN 'Seeded category number ' || i END
    FROM generate_series(1, $1::int) AS i`, [rows])
}

/** The big lists' rows: about 113 bytes of JSON each (about 110 MB at 1,000,000 rows), as in the measurements the big-list targets came from. */
const LONG_DESCRIPTION = 'a category seeded for the big-list benchmark, with a description of some length'

/** Writes `rows` long rows by SQL into a server's own table; returns the byte length of the list they make. */
export async function seedLongRows (databaseUrl: string, rows: number): Promise<number> {
  await bulkInsert(databaseUrl, `INSERT INTO categories (name, description)
    SELECT 'Category ' || i, $2 || ' ' || i FROM generate_series(1, $1::int) AS i`, [rows, LONG_DESCRIPTION])
  let bytes = 1
  for (let i = 1; i <= rows; i++) bytes += Buffer.byteLength(JSON.stringify({ id: i, name: `Category ${i}`, description: `${LONG_DESCRIPTION} ${i}` })) + 1
  return bytes
}

/** The middle value (the upper of the two middle ones for an even count); NaN for none. */
export const median = (values: number[]): number => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? NaN

/** PostgreSQL's own speed of handing the rows over: `COPY … TO STDOUT` of the categories, read and dropped. */
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

/** The rows the profilers serve: for the in-memory servers in a file (CEILING_DATA), for the others through their API. */
export interface ProfileRows { list: SeedRow[], file: string }

export async function profileRows (postgres: Postgres, count: number): Promise<ProfileRows> {
  const list = seedRows(count)
  const file = path.join(postgres.workDir, `rows-${count}.json`)
  await writeFile(file, JSON.stringify(list))
  return { list, file }
}

/**
 * A server for the profilers (profile.ts, perf-profile.ts): started with the rows,
 * from their file or seeded through its API into a fresh database named
 * `<databasePrefix>_<kind>_…`; and its list's ETag, for the If-None-Match
 * scenario. A server that fails to seed is stopped.
 */
export async function startSeededServer (kind: ServerKind, postgres: Postgres, rows: ProfileRows, options: { databasePrefix: string, label: string, nodeArgs: string[] }): Promise<{ server: RunningServer, etag: string }> {
  const inMemory = IN_MEMORY.includes(kind)
  const server = await startServer(kind, {
    ...(inMemory ? { ceilingData: rows.file } : { databaseUrl: await postgres.createDatabase(`${options.databasePrefix}_${kind}_${Date.now().toString(36)}`) }),
    logLevel: 'info',
    workDir: postgres.workDir,
    label: options.label,
    nodeArgs: options.nodeArgs
  })
  try {
    if (!inMemory) await seedThroughApi(server.url, rows.list)
    // Without Accept-Encoding, as wrk asks: fetch's own would get the compressed list's tag, which never matches.
    const first = await fetch(`${server.url}/v1/categories`, { headers: { ...AUTH, 'accept-encoding': 'identity' } })
    await first.arrayBuffer()
    return { server, etag: first.headers.get('etag') ?? '"none"' }
  } catch (err) {
    await server.stop()
    throw err
  }
}

/** A profiler's report: written to outDir/file and printed, and where it went logged. */
export async function publishReport (outDir: string, file: string, lines: string[], log: (message: string) => void): Promise<void> {
  await writeFile(path.join(outDir, file), lines.join('\n'))
  process.stdout.write(lines.join('\n') + '\n')
  log(`wrote ${path.join(outDir, file)}`)
}

/**
 * Runs a bench script's main and exits with its code (0 when it returns none),
 * or with `crashCode` when it throws: an explicit exit, whatever the run left
 * open (servers, load generators, timers).
 */
export async function runToExit (main: () => Promise<number | void>, crashCode = 1): Promise<never> {
  try {
    process.exit((await main()) ?? 0)
  } catch (err) {
    console.error(err)
    process.exit(crashCode)
  }
}
