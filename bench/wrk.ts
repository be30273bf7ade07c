/*
 * The load generator: wrk (C, one event loop per thread), one process per window, driven by wrk/scenario.lua.
 * On 2 cores the load generator takes its CPU from the server it measures; wrk needs about a third of
 * autocannon's CPU per request (bench/README.md), so the faster servers keep their core.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process'
import path from 'node:path'
import { AUTH, LIST_PATH, log, numberFromEnv } from './servers.js'

const SCRIPT = path.join(import.meta.dirname, 'wrk', 'scenario.lua')
/** Slow answers (a 10,000-row list on a busy machine) count in the throughput and the p99, not as errors. */
const TIMEOUT = '30s'
const SETTLE_TIMEOUT_MS = 60_000
/** The write share of `mixed` and `writes`. */
const ONE_WRITE_IN = 20
/** A prime: stepping by it through a smaller range of ids visits each once, in scattered order. */
const DELETE_STEP = 1_000_003

export type LoadKind = 'get' | 'post' | 'patch' | 'delete' | 'mixed' | 'writes'

export interface LoadSpec {
  url: string
  kind: LoadKind
  connections: number
  durationS: number
  warmupS: number
  path?: string
  headers?: Record<string, string>
  namePrefix?: string
  /** patch, writes: the ids updated at random. */
  updateIds?: { first: number, last: number }
  /** delete, writes: the ids deleted, each once over every stream; this load is stream `stream` of `streams`. */
  deleteIds?: { first: number, last: number, stream: number, streams: number }
  /** Each connection waits this long before its next request (the soak's steady rate). */
  delayMs?: number
}

export interface LoadResult {
  rps: number
  p50: number
  p99: number
  total: number
  /** Socket errors and timeouts: no HTTP answer at all. */
  socketErrors: number
  /** Answers with a status above 399 (wrk does not tell them apart). */
  badStatuses: number
  /** Mean bytes per response, headers included: a 304 scenario answered with 200s shows here. */
  bytesPerResponse: number
  /** wrk's own CPU over the window. */
  cpuSeconds: number
}

/** wrk's own threads: one by default, so the load generator never takes more than one of two cores. */
const threads = (spec: LoadSpec): number =>
  Math.min(Math.max(1, numberFromEnv('BENCH_WRK_THREADS', 1)), spec.connections)

/** Installs Debian's wrk when it is missing; returns its version line. */
export function ensureWrk (): string {
  // `wrk -v` prints its version and usage, and exits with 1.
  const version = (): string | undefined => {
    const run = spawnSync('wrk', ['-v'], { encoding: 'utf8' })
    return run.error === undefined ? run.stdout.split(' Copyright')[0] : undefined
  }
  const installed = version()
  if (installed !== undefined) return installed
  log('installing wrk from Debian\'s packages')
  execFileSync('apt-get', ['update', '-qq'], { stdio: 'ignore' })
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' }
  execFileSync('apt-get', ['install', '-y', '-qq', 'wrk'], { stdio: 'ignore', env })
  return version() ?? 'wrk did not install'
}

function scriptEnv (spec: LoadSpec, deleteStream: number, deleteStreams: number): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    BENCH_WRK_KIND: spec.kind,
    BENCH_WRK_PREFIX: spec.namePrefix ?? 'bench',
    BENCH_WRK_EVERY: String(ONE_WRITE_IN),
    BENCH_WRK_THREADS: String(threads(spec)),
    BENCH_WRK_DELAY_MS: String(spec.delayMs ?? 0)
  }
  if (spec.updateIds !== undefined) {
    env.BENCH_WRK_UPDATE_FIRST = String(spec.updateIds.first)
    env.BENCH_WRK_UPDATE_LAST = String(spec.updateIds.last)
  }
  if (spec.deleteIds !== undefined) {
    const count = spec.deleteIds.last - spec.deleteIds.first + 1
    if (count >= DELETE_STEP) throw new Error(`a delete range must hold fewer than ${DELETE_STEP} ids`)
    env.BENCH_WRK_DELETE_STEP = String(DELETE_STEP)
    env.BENCH_WRK_DELETE_FIRST = String(spec.deleteIds.first)
    env.BENCH_WRK_DELETE_COUNT = String(count)
    env.BENCH_WRK_DELETE_STREAM = String(deleteStream)
    env.BENCH_WRK_DELETE_STREAMS = String(deleteStreams)
  }
  return env
}

async function wrk (spec: LoadSpec, durationS: number, env: NodeJS.ProcessEnv): Promise<LoadResult> {
  const headers = Object.entries(spec.headers ?? AUTH).flatMap(([name, value]) => ['-H', `${name}: ${value}`])
  const connections = ['-t', String(threads(spec)), '-c', String(spec.connections)]
  const target = `${spec.url}${spec.path ?? LIST_PATH}`
  const args = [...connections, '-d', `${durationS}s`, '--timeout', TIMEOUT, ...headers, '-s', SCRIPT, target]
  const child = spawn('wrk', args, { stdio: ['ignore', 'pipe', 'pipe'], env })
  let out = ''
  child.stdout.on('data', (chunk: Buffer) => { out += chunk.toString() })
  child.stderr.on('data', (chunk: Buffer) => { out += chunk.toString() })
  const code = await new Promise<number | null>((resolve, reject) => {
    child.once('error', reject)
    child.once('close', resolve)
  })
  const line = out.split('\n').find(l => l.startsWith('BENCH_RESULT '))
  if (code !== 0 || line === undefined) throw new Error(`wrk exited with ${code}: ${out.trim()}`)
  return JSON.parse(line.slice('BENCH_RESULT '.length)) as LoadResult
}

/** One answer to a plain GET: requests still in flight from the last window do not leak into the next. */
async function settle (spec: LoadSpec): Promise<void> {
  const options = { headers: spec.headers ?? AUTH, signal: AbortSignal.timeout(SETTLE_TIMEOUT_MS) }
  const response = await fetch(`${spec.url}${spec.path ?? LIST_PATH}`, options)
  await response.arrayBuffer()
}

/**
 * A warm-up window, then the measured one; onMeasuring is called as it begins. The warm-up deletes from its own
 * streams, so that the measured window never deletes an id twice.
 */
export async function runLoad (spec: LoadSpec, onMeasuring: () => void = () => {}): Promise<LoadResult> {
  const stream = spec.deleteIds?.stream ?? 0
  const streams = spec.deleteIds?.streams ?? 1
  await settle(spec)
  if (spec.warmupS > 0) {
    await wrk(spec, spec.warmupS, scriptEnv(spec, stream, 2 * streams))
    await settle(spec)
  }
  onMeasuring()
  return await wrk(spec, spec.durationS, scriptEnv(spec, streams + stream, 2 * streams))
}
