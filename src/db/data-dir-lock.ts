import { readFileSync } from 'node:fs'
import { mkdir, open, readFile, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { StartupError } from '../startup-error.js'

/**
 * One petstore process at a time owns a data directory's embedded PostgreSQL. The
 * owner is recorded in DATA_DIR/petstore.lock (pid, the process's start time, its
 * address, its postgres's pid). A lock whose process is gone, or whose pid now
 * belongs to a process started at another time (pid reuse), is stale: the next
 * start replaces it and may stop the postgres it names, which is then an orphan.
 */
export interface LockOwner {
  pid: number
  /** Linux: the process's start time in clock ticks since boot (/proc/<pid>/stat), to tell pid reuse apart. */
  startTime?: string
  /** Where the owner serves, for the message of a refused second start. */
  address?: string
  postgresPid?: number
}

export interface DataDirLock {
  file: string
  /** The stale owner this lock replaced, if any: its postgres may still run (an orphan). */
  previous: LockOwner | undefined
  record: (fields: Partial<LockOwner>) => Promise<void>
  release: () => Promise<void>
}

const LOCK_FILE = 'petstore.lock'

/** Linux only; undefined elsewhere (then only the pid is compared). */
export function processStartTime (pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // Fields after the command name, which is in parentheses and may contain spaces; starttime is field 22.
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
  if (!isAlive(owner.pid)) return false
  return owner.startTime === undefined || processStartTime(owner.pid) === owner.startTime
}

function parseOwner (text: string): LockOwner | undefined {
  try {
    const owner = JSON.parse(text) as LockOwner
    return Number.isInteger(owner.pid) && owner.pid > 0 ? owner : undefined
  } catch {
    return undefined
  }
}

export function describeOwner (owner: LockOwner): string {
  return `pid ${owner.pid}${owner.address === undefined ? '' : `, ${owner.address}`}`
}

/** Takes the data directory's lock, or refuses in one line naming the live owner. */
export async function lockDataDir (dir: string, address?: string): Promise<DataDirLock> {
  const file = path.join(dir, LOCK_FILE)
  await mkdir(dir, { recursive: true, mode: 0o700 }).catch((err: unknown) => {
    throw new StartupError(`cannot create DATA_DIR ${dir}: ${(err as Error).message}; set DATA_DIR to a directory this user can write`, { cause: err })
  })
  const me: LockOwner = { pid: process.pid, startTime: processStartTime(process.pid), address }
  let previous: LockOwner | undefined
  // Three tries: a stale lock is removed, then created again exclusively; a racing start that wins makes us refuse.
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      const handle = await open(file, 'wx', 0o600)
      await handle.writeFile(JSON.stringify(me) + '\n')
      await handle.close()
      return lockHandle(file, me, previous)
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') {
        throw new StartupError(`cannot write the lock file ${file}: ${(err as Error).message}; set DATA_DIR to a directory this user can write`, { cause: err })
      }
    }
    const text = await readFile(file, 'utf8').catch(() => '')
    const owner = parseOwner(text)
    if (owner !== undefined && ownerIsAlive(owner)) {
      throw new StartupError(`DATA_DIR ${dir} is in use by another petstore process (${describeOwner(owner)}); stop that one first, or give this one its own DATA_DIR (or a DATABASE_URL)`)
    }
    // Remove the stale lock only if it is still the one we read (another start may have replaced it meanwhile).
    if (await readFile(file, 'utf8').catch(() => undefined) === text) {
      previous = owner
      await rm(file, { force: true })
    }
  }
  throw new StartupError(`DATA_DIR ${dir}: could not take ${file}; other starts keep racing for it`)
}

function lockHandle (file: string, me: LockOwner, previous: LockOwner | undefined): DataDirLock {
  let released = false
  return {
    file,
    previous,
    record: async (fields) => {
      Object.assign(me, fields)
      if (!released) await writeFile(file, JSON.stringify(me) + '\n', { mode: 0o600 })
    },
    release: async () => {
      if (released) return
      released = true
      // Only our own lock: never remove one a later owner wrote.
      const owner = parseOwner(await readFile(file, 'utf8').catch(() => ''))
      if (owner?.pid === me.pid && owner.startTime === me.startTime) await rm(file, { force: true })
    }
  }
}
