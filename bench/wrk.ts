/*
 * The default load generator: wrk (C, one event loop per thread), one process
 * per window, driven by bench/wrk/scenario.lua. On 2 cores the load generator
 * shares the CPU with the server it measures; wrk needs a fraction of
 * autocannon's CPU per request, so less of the server's CPU goes to it (the
 * difference is measured in bench/README.md).
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process'
import path from 'node:path'
import type { LoadResult, LoadSpec } from './load.js'
import type { LoadGenerator } from './servers.js'

const SCRIPT = path.join(import.meta.dirname, 'wrk', 'scenario.lua')
const CLOCK_TICKS_PER_SECOND = 100

interface WrkResult {
  requests: number
  durationUs: number
  bytes: number
  connect: number
  read: number
  write: number
  status: number
  timeout: number
  p50Us: number
  p99Us: number
  cpuTicks: number
}

/** Installs Debian's wrk when it is missing (as scripts/test-cluster.sh does for haproxy); returns its version line. */
export function ensureWrk (log: (message: string) => void): string {
  // `wrk -v` prints its version and usage, and exits with 1.
  const version = (): string | undefined => {
    const run = spawnSync('wrk', ['-v'], { encoding: 'utf8' })
    return run.error === undefined ? run.stdout.split('\n')[0] : undefined
  }
  const installed = version()
  if (installed !== undefined) return installed
  log('installing wrk from Debian\'s packages')
  execFileSync('apt-get', ['update', '-qq'], { stdio: 'ignore' })
  execFileSync('apt-get', ['install', '-y', '-qq', 'wrk'], { stdio: 'ignore', env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } })
  return version() ?? 'wrk did not install'
}

/** wrk's own threads: one by default, so the load generator never takes more than one of the two cores. */
const threads = (): number => Math.max(1, Number(process.env.BENCH_WRK_THREADS ?? 1))

async function wrk (spec: LoadSpec, durationS: number): Promise<WrkResult> {
  const args = [
    '-t', String(Math.min(threads(), spec.connections)), '-c', String(spec.connections), '-d', `${durationS}s`,
    // Long enough that a slow answer (10,000 rows on a busy machine) counts in the throughput and the p99, not as an error.
    '--timeout', '30s',
    ...Object.entries(spec.headers).flatMap(([name, value]) => ['-H', `${name}: ${value}`]),
    '-s', SCRIPT, `${spec.url}${spec.path}`
  ]
  const child = spawn('wrk', args, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, BENCH_WRK_KIND: spec.kind, BENCH_WRK_POST_EVERY: String(spec.postEvery), BENCH_WRK_PREFIX: spec.namePrefix }
  })
  let out = ''
  child.stdout.on('data', (chunk: Buffer) => { out += chunk.toString() })
  child.stderr.on('data', (chunk: Buffer) => { out += chunk.toString() })
  const code = await new Promise<number | null>((resolve, reject) => { child.once('error', reject); child.once('close', resolve) })
  const line = out.split('\n').find(l => l.startsWith('BENCH_RESULT '))
  if (code !== 0 || line === undefined) throw new Error(`wrk exited with ${code}: ${out.trim()}`)
  return JSON.parse(line.slice('BENCH_RESULT '.length)) as WrkResult
}

async function settle (spec: LoadSpec): Promise<void> {
  const response = await fetch(`${spec.url}${spec.path}`, { headers: spec.headers, signal: AbortSignal.timeout(60_000) })
  await response.arrayBuffer()
}

export function wrkLoadGenerator (): LoadGenerator {
  return {
    name: 'wrk',
    run: async (spec, onMeasuring) => {
      if (spec.rate > 0) throw new Error('wrk runs as fast as the server answers; a steady rate needs BENCH_LOAD=autocannon')
      await settle(spec)
      if (spec.warmupS > 0) {
        await wrk(spec, spec.warmupS)
        await settle(spec)
      }
      onMeasuring()
      const r = await wrk(spec, spec.durationS)
      const durationS = r.durationUs / 1e6
      const result: LoadResult = {
        rps: r.requests / durationS,
        p50: Math.round(r.p50Us / 100) / 10,
        p99: Math.round(r.p99Us / 100) / 10,
        total: r.requests,
        durationS,
        socketErrors: r.connect + r.read + r.write + r.timeout,
        // wrk counts statuses above 399 without telling them apart; everything else answered.
        statusCounts: { '1xx-3xx': r.requests - r.status, ...(r.status > 0 ? { '4xx-5xx': r.status } : {}) },
        bytesPerResponse: r.requests === 0 ? 0 : Math.round(r.bytes / r.requests),
        cpuSeconds: r.cpuTicks / CLOCK_TICKS_PER_SECOND
      }
      return result
    },
    stop: async () => {}
  }
}
