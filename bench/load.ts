/*
 * autocannon as the load generator (BENCH_LOAD=autocannon; wrk is the default,
 * bench/wrk.ts), in its own process so it does not share a CPU queue
 * with bench/run.ts. Forked with an IPC channel: it receives one LoadSpec per
 * scenario, runs an optional warm-up, tells the parent when the measured part
 * starts (so RSS and CPU sampling cover exactly that window), and answers
 * with a LoadResult.
 */
import autocannon, { type Result } from 'autocannon'

export interface LoadSpec {
  url: string
  /** get: GET the path; post: POST unique categories; mixed: every postEvery-th request is a POST, the rest GET. */
  kind: 'get' | 'post' | 'mixed'
  path: string
  headers: Record<string, string>
  connections: number
  durationS: number
  warmupS: number
  /** Requests per second over all connections; 0 means as fast as the server answers. */
  rate: number
  postEvery: number
  /** Makes POSTed names unique across scenarios and runs. */
  namePrefix: string
}

export interface LoadResult {
  rps: number
  p50: number
  p99: number
  total: number
  durationS: number
  /** Socket errors and timeouts (no HTTP response at all). */
  socketErrors: number
  /** Responses by status; wrk only tells `1xx-3xx` from `4xx-5xx`. */
  statusCounts: Record<string, number>
  /** Mean bytes per response, headers included (a 304 scenario answered with 200s shows here). */
  bytesPerResponse: number
  /** CPU seconds the load generator used in the measured window. */
  cpuSeconds: number
}

export type LoadMessage = { type: 'measuring' } | { type: 'result', result: LoadResult } | { type: 'error', message: string }

let sequence = 0

function requestsFor (spec: LoadSpec): NonNullable<Parameters<typeof autocannon>[0]['requests']> {
  const post = (req: { headers: Record<string, string> }): { method: string, path: string, headers: Record<string, string>, body: string } => ({
    method: 'POST',
    path: spec.path,
    headers: { ...req.headers, 'content-type': 'application/json' },
    body: JSON.stringify({ name: `${spec.namePrefix}-${++sequence}`, description: 'created by the benchmark' })
  })
  switch (spec.kind) {
    case 'get':
      return [{ method: 'GET', path: spec.path }]
    case 'post':
      return [{ setupRequest: req => post(req) }]
    case 'mixed':
      return [{
        setupRequest: req => (++sequence % spec.postEvery === 0 ? post(req) : { method: 'GET', path: spec.path, headers: req.headers })
      }]
  }
}

async function cannon (spec: LoadSpec, durationS: number): Promise<Result> {
  return await new Promise((resolve, reject) => {
    autocannon({
      url: spec.url,
      connections: spec.connections,
      duration: durationS,
      // Long enough that a slow answer (10,000 rows on a busy machine) counts in the throughput and the p99, not as an error.
      timeout: 30,
      headers: spec.headers,
      requests: requestsFor(spec),
      ...(spec.rate > 0 ? { overallRate: spec.rate } : {})
    }, (err, result) => { if (err !== null) reject(err); else resolve(result) })
  })
}

/**
 * Waits for one answer to a plain GET. When autocannon stops, the server may
 * still be working through the requests it had in flight (slow ones, like the
 * 10,000-row list, take seconds); this keeps that backlog out of the next window.
 */
async function settle (spec: LoadSpec): Promise<void> {
  const response = await fetch(`${spec.url}${spec.path}`, { headers: spec.headers, signal: AbortSignal.timeout(60_000) })
  await response.arrayBuffer()
}

async function run (spec: LoadSpec): Promise<LoadResult> {
  await settle(spec)
  if (spec.warmupS > 0) {
    await cannon(spec, spec.warmupS)
    await settle(spec)
  }
  process.send?.({ type: 'measuring' } satisfies LoadMessage)
  const cpuBefore = process.cpuUsage()
  const result = await cannon(spec, spec.durationS)
  const cpu = process.cpuUsage(cpuBefore)
  const statusCounts: Record<string, number> = {}
  for (const [code, { count }] of Object.entries(result.statusCodeStats)) statusCounts[code] = count
  return {
    rps: result.requests.average,
    p50: result.latency.p50,
    p99: result.latency.p99,
    total: result.requests.total,
    durationS: result.duration,
    socketErrors: result.errors, // autocannon counts timeouts among errors
    statusCounts,
    bytesPerResponse: result.requests.total === 0 ? 0 : Math.round(result.throughput.total / result.requests.total),
    cpuSeconds: (cpu.user + cpu.system) / 1e6
  }
}

process.on('message', (spec: LoadSpec) => {
  run(spec).then(
    result => process.send?.({ type: 'result', result } satisfies LoadMessage),
    (err: unknown) => process.send?.({ type: 'error', message: String(err) } satisfies LoadMessage)
  )
})
process.on('disconnect', () => process.exit(0))
