import { execFileSync, spawn } from 'node:child_process'
import { once } from 'node:events'
import { chmod, chown, mkdtemp, rm, writeFile } from 'node:fs/promises'
import { connect } from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { ensureDebianPackage } from '../../helpers/debian-package.js'
import { nextPort } from './ports.js'

/*
 * A real PgBouncer (Debian's package, installed when missing) in front of a
 * PostgreSQL server, with its stock settings: the configuration names only what it
 * needs to run (where it listens, the server, the credentials, the pool mode).
 */

export type PoolMode = 'session' | 'transaction'

export interface PgBouncer {
  mode: PoolMode
  port: number
  /** The server URL's credentials and the given database, through PgBouncer. */
  urlFor: (databaseUrl: string) => string
  /** Everything PgBouncer logged. */
  log: () => string
  stop: () => Promise<void>
}

interface Teardown {
  teardown: (fn: () => Promise<void> | void) => void
}

/** Installs PgBouncer from Debian's packages when it is missing; its version. */
export function ensurePgBouncer (): string {
  return ensureDebianPackage('pgbouncer', ['--version'])
}

/** PgBouncer refuses to run as root: as root it is started as this user (`-u`), which must read its files. */
function unprivilegedUser (): { name: string; uid: number; gid: number } | undefined {
  if (process.getuid?.() !== 0) return undefined
  for (const name of ['postgres', 'nobody']) {
    try {
      const [uid, gid] = ['-u', '-g'].map(flag => Number(execFileSync('id', [flag, name], { encoding: 'utf8' }).trim()))
      return { name, uid: uid as number, gid: gid as number }
    } catch {}
  }
  throw new Error('running as root, and neither a postgres nor a nobody user exists to run pgbouncer as')
}

async function accepting (port: number): Promise<boolean> {
  return await new Promise(resolve => {
    const socket = connect(port, '127.0.0.1')
    socket.once('connect', () => {
      socket.destroy()
      resolve(true)
    })
    socket.once('error', () => {
      resolve(false)
    })
  })
}

/**
 * Starts PgBouncer in `mode` in front of the server of `serverUrl` (every database
 * name is passed through). Its configuration and userlist are written 0600 into a
 * private temporary directory; the process is stopped and the directory removed by
 * `stop()` and at teardown.
 */
export async function startPgBouncer (t: Teardown, serverUrl: string, mode: PoolMode): Promise<PgBouncer> {
  ensurePgBouncer()
  const server = new URL(serverUrl)
  const user = decodeURIComponent(server.username) || 'postgres'
  // Without a password (a trusting server) PgBouncer still checks the client's: any will do.
  const password = decodeURIComponent(server.password) || 'pgbouncer-test'
  const port = await nextPort()
  const dir = await mkdtemp(path.join(tmpdir(), 'petstore-pgbouncer-'))
  const quote = (s: string): string => `"${s.replace(/"/g, '""')}"`
  const files = {
    'userlist.txt': `${quote(user)} ${quote(password)}\n`,
    'pgbouncer.ini': [
      '[databases]',
      `* = host=${server.hostname} port=${server.port || '5432'}`,
      '[pgbouncer]',
      'listen_addr = 127.0.0.1',
      `listen_port = ${port}`,
      'unix_socket_dir =',
      `auth_file = ${path.join(dir, 'userlist.txt')}`,
      `pool_mode = ${mode}`,
      ''
    ].join('\n')
  }
  const runAs = unprivilegedUser()
  for (const [name, text] of Object.entries(files)) {
    const file = path.join(dir, name)
    await writeFile(file, text, { mode: 0o600 })
    if (runAs !== undefined) await chown(file, runAs.uid, runAs.gid)
  }
  await chmod(dir, 0o700)
  if (runAs !== undefined) await chown(dir, runAs.uid, runAs.gid)

  const child = spawn(
    'pgbouncer',
    [...(runAs === undefined ? [] : ['-u', runAs.name]), path.join(dir, 'pgbouncer.ini')],
    { stdio: ['ignore', 'pipe', 'pipe'] }
  )
  let output = ''
  child.stdout.on('data', (d: Buffer) => {
    output += d.toString()
  })
  child.stderr.on('data', (d: Buffer) => {
    output += d.toString()
  })
  const exited = once(child, 'exit')
  // Should the test process end without its teardown (an uncaught error), PgBouncer must not outlive it.
  const killOnExit = (): void => {
    child.kill('SIGKILL')
  }
  process.once('exit', killOnExit)
  let stopped = false
  const stop = async (): Promise<void> => {
    if (stopped) return
    stopped = true
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGINT') // PgBouncer's immediate shutdown
      const killed = setTimeout(() => {
        child.kill('SIGKILL')
      }, 5000)
      await exited
      clearTimeout(killed)
    }
    process.removeListener('exit', killOnExit)
    await rm(dir, { recursive: true, force: true })
  }
  t.teardown(stop)
  const deadline = Date.now() + 10000
  while (!(await accepting(port))) {
    if (child.exitCode !== null || Date.now() > deadline) {
      await stop()
      throw new Error(`pgbouncer did not start:\n${output}`)
    }
    await sleep(20)
  }
  const urlFor = (databaseUrl: string): string => {
    const url = new URL(databaseUrl)
    url.hostname = '127.0.0.1'
    url.port = String(port)
    url.username = encodeURIComponent(user)
    url.password = encodeURIComponent(password)
    return url.toString()
  }
  return { mode, port, urlFor, log: () => output, stop }
}
