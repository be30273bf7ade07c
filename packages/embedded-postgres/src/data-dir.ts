import { randomBytes } from 'node:crypto'
import { existsSync, readFileSync } from 'node:fs'
import { mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { EmbeddedPostgresError } from './error.js'

/** DATA_DIR/petstore.lock: the one process that owns the data directory's embedded PostgreSQL. */
export interface LockOwner {
  pid: number
  /** Linux: clock ticks since boot (/proc/<pid>/stat), so that a reused pid is not taken for the owner. */
  startTime?: string
  address?: string
  postgresPid?: number
  /** For `npm run keys`, which uses the running service's embedded PostgreSQL. */
  postgresPort?: number
}

export interface DataDirLock {
  /** The stale owner this lock replaced: its postgres may still run, an orphan. */
  previous: LockOwner | undefined
  record: (fields: Partial<LockOwner>) => Promise<void>
  release: () => Promise<void>
}

export async function readOrCreateSecret (file: string, prefix = ''): Promise<{ value: string, created: boolean }> {
  if (existsSync(file)) return { value: (await readFile(file, 'utf8')).trim(), created: false }
  await mkdir(path.dirname(file), { recursive: true })
  const value = `${prefix}${randomBytes(24).toString('base64url')}`
  await writeFile(file, value + '\n', { mode: 0o600 })
  return { value, created: true }
}

function startTimeOf (pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // The command name, in parentheses, may hold spaces: starttime is the 20th field after it.
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]
  } catch {
    return undefined
  }
}

export function isAlive (pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM'
  }
}

export function ownerIsAlive (owner: LockOwner): boolean {
  return isAlive(owner.pid) && (owner.startTime === undefined || startTimeOf(owner.pid) === owner.startTime)
}

export function parseOwner (text: string): LockOwner | undefined {
  try {
    const owner = JSON.parse(text) as LockOwner
    return Number.isInteger(owner.pid) && owner.pid > 0 ? owner : undefined
  } catch {
    return undefined
  }
}

const lockFile = (dir: string): string => path.join(dir, 'petstore.lock')

/** The live process that owns the data directory now, if any. */
export async function currentOwner (dir: string): Promise<LockOwner | undefined> {
  const owner = parseOwner(await readFile(lockFile(dir), 'utf8').catch(() => ''))
  return owner !== undefined && ownerIsAlive(owner) ? owner : undefined
}

export async function lockDataDir (dir: string, address?: string): Promise<DataDirLock> {
  const file = lockFile(dir)
  const hint = 'set DATA_DIR to a directory this user can write'
  await mkdir(dir, { recursive: true, mode: 0o700 }).catch((err: unknown) => {
    throw new EmbeddedPostgresError(`cannot create DATA_DIR ${dir}: ${(err as Error).message}; ${hint}`, { cause: err })
  })
  const me: LockOwner = { pid: process.pid, startTime: startTimeOf(process.pid), address }
  let previous: LockOwner | undefined
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      await writeFile(file, JSON.stringify(me) + '\n', { mode: 0o600, flag: 'wx' })
      return lockHandle(file, me, previous)
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') {
        const message = `cannot write the lock file ${file}: ${(err as Error).message}; ${hint}`
        throw new EmbeddedPostgresError(message, { cause: err })
      }
    }
    const text = await readFile(file, 'utf8').catch(() => '')
    const owner = parseOwner(text)
    if (owner !== undefined && ownerIsAlive(owner)) {
      const where = `pid ${owner.pid}${owner.address === undefined ? '' : `, ${owner.address}`}`
      throw new EmbeddedPostgresError(`DATA_DIR ${dir} is in use by another petstore process (${where}); ` +
        'stop that one first, or give this one its own DATA_DIR (or a DATABASE_URL)')
    }
    // A racing start may have replaced the stale lock meanwhile: remove only the one we read.
    if (await readFile(file, 'utf8').catch(() => undefined) === text) {
      previous = owner
      await rm(file, { force: true })
    }
  }
  throw new EmbeddedPostgresError(`DATA_DIR ${dir}: could not take ${file}; other starts keep racing for it`)
}

function lockHandle (file: string, me: LockOwner, previous: LockOwner | undefined): DataDirLock {
  let released = false
  return {
    previous,
    record: async (fields) => {
      Object.assign(me, fields)
      if (released) return
      // Written beside and renamed over: a start reading the lock meanwhile sees the old owner or the new, never an
      // empty file it would take for a stale lock.
      const next = `${file}.${randomBytes(6).toString('hex')}`
      await writeFile(next, JSON.stringify(me) + '\n', { mode: 0o600 })
      await rename(next, file)
    },
    release: async () => {
      if (released) return
      released = true
      const owner = parseOwner(await readFile(file, 'utf8').catch(() => ''))
      if (owner?.pid === me.pid && owner.startTime === me.startTime) await rm(file, { force: true })
    }
  }
}
