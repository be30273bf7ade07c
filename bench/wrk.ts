// The load generator: wrk, one thread (the server keeps the other core), one process per window.
import { execFileSync, spawn, spawnSync } from 'node:child_process'
import { once } from 'node:events'
import path from 'node:path'
import { cpuSplit } from './proc-stats.js'
import { AUTH, LIST_PATH, log, numberFromEnv } from './servers.js'

const SCRIPT = path.join(import.meta.dirname, 'wrk', 'scenario.lua')
/** Slow answers (a 10,000-row list on a busy machine) count in the throughput and the p99, not as errors. */
const TIMEOUT = '30s'
const SETTLE_TIMEOUT_MS = 60_000
/** A prime: stepping by it through a smaller range of ids visits each once, in scattered order. */
const DELETE_STEP = 1_000_003

export interface Settings { durationS: number, warmupS: number, rounds: number, connections: number }

export function settings (own: Partial<Settings> = {}): Settings {
  const base = { durationS: 10, warmupS: 3, rounds: 1, connections: 50, ...own }
  return {
    durationS: numberFromEnv('BENCH_DURATION', base.durationS),
    warmupS: numberFromEnv('BENCH_WARMUP', base.warmupS),
    rounds: Math.max(1, Math.round(numberFromEnv('BENCH_ROUNDS', base.rounds))),
    connections: numberFromEnv('BENCH_CONNECTIONS', base.connections)
  }
}

export type LoadKind = 'get' | 'post' | 'patch' | 'delete' | 'mixed' | 'writes'

export interface LoadSpec extends Omit<Settings, 'rounds'> {
  url: string
  kind: LoadKind
  path?: string
  headers?: Record<string, string>
  /** patch, writes: a random id of 1 to this is updated. */
  updateRows?: number
  /** delete, writes: the ids deleted, each once over all streams; this load is stream `stream` (0) of `streams` (1). */
  deleteIds?: { first: number, last: number, stream?: number, streams?: number }
  /** Each connection waits this long before its next request (the soak's steady rate). */
  delayMs?: number
}

/**
 * As wrk/scenario.lua writes it. failures: socket errors, timeouts and statuses above 399 (wrk tells no more);
 * bytesPerResponse, headers included, tells a 304 from a 200; cpuSeconds: wrk's own (loads run at once share theirs).
 */
export interface LoadResult {
  rps: number
  p50: number
  p99: number
  total: number
  failures: number
  bytesPerResponse: number
  cpuSeconds: number
}

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

async function wrk (spec: LoadSpec, durationS: number, deleteStream: number): Promise<LoadResult> {
  const { first = 1, last = 1 } = spec.deleteIds ?? {}
  if (last - first + 1 >= DELETE_STEP) throw new Error(`a delete range must hold fewer than ${DELETE_STEP} ids`)
  const env = {
    ...process.env,
    BENCH_WRK_KIND: spec.kind,
    BENCH_WRK_DELAY_MS: String(spec.delayMs ?? 0),
    BENCH_WRK_UPDATE_ROWS: String(spec.updateRows ?? 1),
    BENCH_WRK_DELETE_STEP: String(DELETE_STEP),
    BENCH_WRK_DELETE_FIRST: String(first),
    BENCH_WRK_DELETE_COUNT: String(last - first + 1),
    BENCH_WRK_DELETE_STREAM: String(deleteStream),
    // The warm-up deletes from streams of its own, so that the measured window never deletes an id twice.
    BENCH_WRK_DELETE_STREAMS: String(2 * (spec.deleteIds?.streams ?? 1))
  }
  const headers = Object.entries(spec.headers ?? AUTH).flatMap(([name, value]) => ['-H', `${name}: ${value}`])
  const target = `${spec.url}${spec.path ?? LIST_PATH}`
  const args = ['-t1', '-c', String(spec.connections), '-d', `${durationS}s`, '--timeout', TIMEOUT, ...headers]
  const childrenBefore = cpuSplit(process.pid).children
  const child = spawn('wrk', [...args, '-s', SCRIPT, target], { stdio: ['ignore', 'pipe', 'pipe'], env })
  let out = ''
  child.stdout.on('data', (chunk: Buffer) => { out += chunk.toString() })
  child.stderr.on('data', (chunk: Buffer) => { out += chunk.toString() })
  const [code] = await once(child, 'close') as [number | null]
  const line = out.split('\n').find(l => l.startsWith('BENCH_RESULT '))
  if (code !== 0 || line === undefined) throw new Error(`wrk exited with ${code}: ${out.trim()}`)
  // wrk's CPU: what this process's reaped children used meanwhile.
  const cpuSeconds = cpuSplit(process.pid).children - childrenBefore
  return { ...JSON.parse(line.slice('BENCH_RESULT '.length)) as Omit<LoadResult, 'cpuSeconds'>, cpuSeconds }
}

/** One answer to a plain GET: requests still in flight from the last window do not leak into the next. */
async function settle (spec: LoadSpec): Promise<void> {
  const options = { headers: spec.headers ?? AUTH, signal: AbortSignal.timeout(SETTLE_TIMEOUT_MS) }
  const response = await fetch(`${spec.url}${spec.path ?? LIST_PATH}`, options)
  await response.arrayBuffer()
}

export async function runLoad (spec: LoadSpec, onMeasuring: () => void = () => {}): Promise<LoadResult> {
  const { stream = 0, streams = 1 } = spec.deleteIds ?? {}
  await settle(spec)
  if (spec.warmupS > 0) {
    await wrk(spec, spec.warmupS, stream)
    await settle(spec)
  }
  onMeasuring()
  return await wrk(spec, spec.durationS, streams + stream)
}
