import { spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { serviceNodeFlags } from '../../bench/start-command.js'
import { builtCheckout } from './built-checkout.js'
import { untracked } from './untracked.js'

/*
 * The service as a real process, started as `npm start` starts it (the run's build, with npm
 * start's node flags): real sockets, real signals, real exit codes, its whole output.
 */

interface Teardown {
  teardown: (fn: () => Promise<void> | void) => void
}

export interface ServerProcess {
  child: ChildProcess
  /** The port in `env.PORT`, else the one the server says it listens on (it throws before that line). */
  readonly port: number
  /** Everything written to stdout and stderr so far. */
  output: () => string
  /**
   * Resolves true once the output contains `pattern`; false when the process
   * exits or `timeoutMs` passes first. Asserting on output without this races the writer.
   */
  waitFor: (pattern: string | RegExp, timeoutMs?: number) => Promise<boolean>
  exited: Promise<number | null>
}

export interface SpawnOptions {
  /** A built checkout (dist/) to run the service in; by default the run's build. */
  cwd?: string
  /** Wait for "Server listening" before returning (default true). */
  listening?: boolean
  /** What node runs; by default npm start's node flags and dist/server.js. */
  nodeArgs?: string[]
  /** Run as this user (the test runs as root). */
  user?: { uid: number; gid: number }
}

const STARTUP_TIMEOUT_MS = 60000
const LISTENING_AT = /Server listening at https?:\/\/\S+?:(\d+)/
const TEARDOWN_TIMEOUT_MS = 15000

/** Only PATH and HOME come from the test's own environment: the server sees exactly `env`. */
export async function startServer (
  t: Teardown,
  env: Record<string, string>,
  options: SpawnOptions = {}
): Promise<ServerProcess> {
  const cwd = options.cwd ?? (await builtCheckout(t))
  const nodeArgs = options.nodeArgs ?? [...serviceNodeFlags(), 'dist/server.js']
  const node = [process.execPath, ...nodeArgs]
  // As another user through setpriv: the test runs as root.
  const line = options.user === undefined
    ? node
    : ['setpriv', `--reuid=${options.user.uid}`, `--regid=${options.user.gid}`, '--clear-groups', ...node]
  const child = spawn(...untracked(line[0] ?? '', line.slice(1)), {
    cwd,
    env: {
      PATH: process.env.PATH ?? '',
      HOME: process.env.HOME ?? '/tmp',
      // The service picks a free port as it listens: one chosen here first could be taken before then, even by
      // an outgoing connection's ephemeral port.
      PORT: '0',
      METRICS_PORT: '0',
      LOG_LEVEL: 'info',
      ...env
    },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let output = ''
  // Wakes the waiters below whenever output arrives or the process ends.
  let wake: () => void = () => {}
  const append = (d: Buffer): void => {
    output += d.toString()
    wake()
  }
  child.stdout?.on('data', append)
  child.stderr?.on('data', append)
  const state = { closed: false }
  const exited = once(child, 'close').then(([code]) => {
    state.closed = true
    wake()
    return code as number | null
  })
  // A test that ends (or fails) with the server still running stops it as an operator would: SIGTERM,
  // so that it stops its embedded PostgreSQL; SIGKILL only if that takes too long (it would orphan postgres).
  t.teardown(async () => {
    if (child.exitCode !== null || child.signalCode !== null) return
    child.kill('SIGTERM')
    const timer = setTimeout(() => {
      child.kill('SIGKILL')
    }, TEARDOWN_TIMEOUT_MS)
    await exited
    clearTimeout(timer)
  })

  const contains = (pattern: string | RegExp): boolean =>
    typeof pattern === 'string' ? output.includes(pattern) : pattern.test(output)
  const waitFor = async (pattern: string | RegExp, timeoutMs = STARTUP_TIMEOUT_MS): Promise<boolean> => {
    const deadline = Date.now() + timeoutMs
    // 'close' comes after the last output: once closed, the output is complete.
    while (!contains(pattern) && !state.closed && Date.now() < deadline) {
      await new Promise<void>(resolve => {
        wake = resolve
        setTimeout(resolve, 100)
      })
    }
    return contains(pattern)
  }
  const server = {
    child,
    get port (): number {
      if (env.PORT !== undefined) return Number(env.PORT)
      const listening = LISTENING_AT.exec(output)
      if (listening === null) throw new Error(`the server has not said where it listens yet:\n${output}`)
      return Number(listening[1])
    },
    output: () => output,
    waitFor,
    exited
  }
  if (options.listening !== false && !(await waitFor('Server listening'))) {
    throw new Error(`server did not start:\n${output}`)
  }
  return server
}

/** A request to the server's /v1/categories with a bearer key (and a JSON body, if given): status and body. */
export async function categoriesRequest (
  server: ServerProcess,
  key: string,
  method = 'GET',
  body?: unknown
): Promise<{ status: number, body: unknown }> {
  const res = await fetch(`http://127.0.0.1:${server.port}/v1/categories`, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body)
  })
  return { status: res.status, body: await res.json() }
}
