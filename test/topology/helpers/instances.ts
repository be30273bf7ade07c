import { spawn, type ChildProcess } from 'node:child_process'
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { BUILT_CHECKOUT_VARIABLE } from '../../helpers/built-checkout.js'
import { untracked } from '../../helpers/untracked.js'
import { nextPort } from './ports.js'

/*
 * Instances of the service as production runs them: `node <npm start's flags>
 * dist/server.js` with NODE_ENV=production, each its own process (an uncaught
 * error ends it, as it would in production, and the test sees the exit).
 * They run the test run's build (test/helpers/built-checkout.ts), else this checkout's dist/.
 * TOPOLOGY_SERVICE_DIR runs another checkout's build instead (to watch a test fail on old code).
 */

const serviceDir =
  process.env.TOPOLOGY_SERVICE_DIR ??
  process.env[BUILT_CHECKOUT_VARIABLE] ??
  fileURLToPath(new URL('../../..', import.meta.url))

export interface Instance {
  name: string
  url: string
  /** Its metrics listener, with `metrics: true`. */
  metricsUrl: string | undefined
  child: ChildProcess
  logFile: string
  /** Set when the process ended; `early` when that was before `stop()` (a failure). */
  exit: { code: number | null; signal: string | null; early: boolean } | undefined
}

export interface Instances {
  list: Instance[]
  urls: string[]
  /** Instances whose process ended before `stop()`. */
  exited: () => Instance[]
  /** The last lines of an instance's log (for a failure report). */
  logTail: (instance: Instance, lines?: number) => string
  /** An instance's whole log. */
  log: (instance: Instance) => string
  /** SIGTERM to each, then its exit code (0 is a clean shutdown). */
  stop: () => Promise<Array<{ name: string; code: number | null; signal: string | null }>>
}

interface Teardown {
  teardown: (fn: () => Promise<void> | void) => void
  passing: () => boolean
  comment: (...message: unknown[]) => void
}

export interface InstanceOptions {
  count: number
  databaseUrl: string
  apiKey: string
  /** More environment for every instance (overrides the defaults). */
  env?: Record<string, string>
  /** Names are `<label> <n> (:<port>)` (default "instance"). */
  label?: string
  /** Metrics on, each on a port of its own (default off). */
  metrics?: boolean
  /** Wait until every instance is ready before returning (default true); else wait with `waitReady`. */
  waitReady?: boolean
  /** Start each once the one before is ready, not all at once (default false). */
  oneByOne?: boolean
}

/** The node flags `npm start` runs the service with (package.json: "node <flags> dist/server.js"). */
function startFlags (): string[] {
  const { scripts } = JSON.parse(readFileSync(path.join(serviceDir, 'package.json'), 'utf8')) as {
    scripts: { start: string }
  }
  return scripts.start.trim().split(/\s+/).slice(1, -1)
}

const logOf = (instance: Instance): string => readFileSync(instance.logFile, 'utf8')

/** Resolves once the instance's /health/ready answers 200; rejects, with its log, when it exits first or after
 * `timeoutMs`. */
export async function waitReady (instance: Instance, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (instance.exit !== undefined) {
      throw new Error(`${instance.name} exited while starting:\n${logOf(instance).slice(-2000)}`)
    }
    try {
      if ((await fetch(`${instance.url}/health/ready`, { signal: AbortSignal.timeout(2000) })).status === 200) return
    } catch {}
    await sleep(100)
  }
  throw new Error(`${instance.name} not ready after ${timeoutMs / 1000} s:\n${logOf(instance).slice(-2000)}`)
}

export async function startInstances (t: Teardown, options: InstanceOptions): Promise<Instances> {
  const logDir = mkdtempSync(path.join(tmpdir(), 'petstore-topology-'))
  const flags = startFlags()
  const list: Instance[] = []
  let stopping = false
  t.teardown(() => {
    // Whatever happens to the test (an instance that fails to start included), no instance outlives it.
    for (const { child } of list) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL')
    // Their logs are kept only for a test that failed: its messages quote just their last lines.
    if (t.passing()) rmSync(logDir, { recursive: true, force: true })
    else t.comment(`the instances' logs are kept in ${logDir}`)
  })
  for (let i = 1; i <= options.count; i++) {
    const port = await nextPort()
    const metricsPort = options.metrics === true ? await nextPort() : 0
    const logFile = path.join(logDir, `instance-${i}.log`)
    const out = openSync(logFile, 'a')
    const child = spawn(...untracked(process.execPath, [...flags, 'dist/server.js']), {
      cwd: serviceDir,
      stdio: ['ignore', out, out],
      env: {
        PATH: process.env.PATH,
        NODE_ENV: 'production',
        HOST: '127.0.0.1',
        PORT: String(port),
        METRICS_HOST: '127.0.0.1',
        METRICS_PORT: String(metricsPort),
        DATABASE_URL: options.databaseUrl,
        API_KEYS: options.apiKey,
        LOG_LEVEL: 'warn',
        SHUTDOWN_DRAIN_MS: '0',
        ...options.env
      }
    })
    closeSync(out)
    const instance: Instance = {
      name: `${options.label ?? 'instance'} ${i} (:${port})`,
      url: `http://127.0.0.1:${port}`,
      metricsUrl: metricsPort === 0 ? undefined : `http://127.0.0.1:${metricsPort}/metrics`,
      child,
      logFile,
      exit: undefined
    }
    child.once('exit', (code, signal) => {
      instance.exit = { code, signal, early: !stopping }
    })
    list.push(instance)
    if (options.oneByOne === true) await waitReady(instance)
  }
  if (options.waitReady !== false) {
    await Promise.all(
      list.map(async instance => {
        await waitReady(instance)
      })
    )
  }

  return {
    list,
    urls: list.map(i => i.url),
    exited: () => list.filter(i => i.exit?.early === true),
    logTail: (instance, lines = 20) => logOf(instance).trimEnd().split('\n').slice(-lines).join('\n'),
    log: logOf,
    stop: async () => {
      stopping = true
      return await Promise.all(
        list.map(async instance => {
          if (instance.exit === undefined) {
            const exited = new Promise<void>(resolve => {
              instance.child.once('exit', () => {
                resolve()
              })
            })
            instance.child.kill('SIGTERM')
            await Promise.race([exited, sleep(20_000)])
          }
          return {
            name: instance.name,
            code: instance.exit?.code ?? null,
            signal: instance.exit?.signal ?? 'still running after 20 s'
          }
        })
      )
    }
  }
}
