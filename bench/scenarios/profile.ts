/*
 * profile: where each microsecond of a request goes (bench/README.md). Each measured window is cut out of V8's
 * profile by time: its clock and process.hrtime are both monotonic.
 */
import { readdir, readFile, rm } from 'node:fs/promises'
import path from 'node:path'
import { cpuSplit, postgresCpuSeconds } from '../proc-stats.js'
import { type ScenarioGroup, header, row } from '../report.js'
import { AUTH, ROOT, type RunningServer, getList, log, metricTotal, numberFromEnv, startSeeded } from '../servers.js'
import { type LoadKind, runLoad, settings } from '../wrk.js'

/** Rows seeded; a PATCH updates one at random, and with 10,000 most updates never meet another of their row. */
const ROWS = numberFromEnv('PROFILE_ROWS', 100)
const INTERVAL_US = 250
const OUT = path.join(ROOT, 'bench', '.tmp', 'profile')
const WINDOWS: Array<{ id: string, title: string, kind: LoadKind }> = [
  { id: 'get100', title: `GET list, ${ROWS} rows`, kind: 'get' },
  { id: 'etag', title: 'GET with If-None-Match (304)', kind: 'get' },
  { id: 'post', title: 'POST (a create)', kind: 'post' },
  { id: 'patch', title: 'PATCH (an update of a random row)', kind: 'patch' }
]

interface CallFrame { functionName: string, url: string }
interface ProfileNode { id: number, callFrame: CallFrame, children?: number[] }
interface CpuProfile { nodes: ProfileNode[], startTime: number, samples: number[], timeDeltas: number[] }

/** A part of the request path: frames whose file contains one of `urls`, functions of `names`, native `natives`. */
interface Rule { label: string, urls?: string[], names?: string[], natives?: string[] }

/** The deepest frame a rule names wins; of the rules naming one frame, the first. */
const RULES: Rule[] = [
  { label: 'garbage collection', natives: ['(garbage collector)'] },
  { label: 'V8 and native code outside JavaScript', natives: ['(program)'] },
  { label: 'auth: SHA-256 of the key (node:crypto)', urls: ['internal/crypto/hash'], natives: ['timingSafeEqual'] },
  { label: 'request id (randomUUID)', urls: ['internal/crypto/random'] },
  { label: 'auth: key check and limits', urls: ['/auth.', '/dist/keys/', 'bearer-auth', 'rate-limit', 'toad-cache'] },
  // traceFields and req: the service's log mixin and request serializer (src/app.ts).
  { label: 'access line (pino)', urls: ['/pino/', 'pino-std', 'sonic-boom'], names: ['traceFields', 'req'] },
  { label: 'duration histogram (prom-client)', urls: ['prom-client'] },
  {
    label: 'request body: JSON parse and validation',
    urls: ['/json-body.', '/interoperable-json.', '/ajv/', 'fastify/lib/validation.js'],
    natives: ['parse']
  },
  { label: 'group commit (group-commit, idempotency)', urls: ['/group-commit.', '/idempotency.'] },
  { label: 'database client (pg, src/db)', urls: ['/node_modules/pg', '/dist/db/'] },
  { label: 'handler and list cache', urls: ['/dist/categories/', '/dist/machinery/', '/replies.', '/resource.'] },
  { label: 'other service code (hooks)', urls: ['/dist/'] },
  { label: 'Fastify: routing, hooks, reply, serialization', urls: ['find-my-way', '/fastify/', 'fast-json-stringify'] },
  { label: 'bench server code', urls: ['/bench/'] },
  { label: 'Node HTTP: parser and request', urls: ['node:_http_server', 'node:_http_common', 'node:_http_incoming'] },
  { label: 'Node HTTP: response and socket writes', urls: ['node:_http_outgoing', 'node:net', 'node:internal/stream'] },
  { label: 'event loop: timers, ticks, events', urls: ['node:internal/timers', 'task_queues', 'node:events'] }
]
const IDLE = '(idle)'

function matches (rule: Rule, frame: CallFrame): boolean {
  if (frame.url === '') return rule.natives?.includes(frame.functionName) === true
  return rule.names?.includes(frame.functionName) === true || rule.urls?.some(part => frame.url.includes(part)) === true
}
const nowUs = (): number => Number(process.hrtime.bigint() / 1000n)

/** The busy microseconds between fromUs and toUs (the profile's clock), by part of the request path. */
function cut (profile: CpuProfile, fromUs: number, toUs: number): Map<string, number> {
  const byId = new Map(profile.nodes.map(node => [node.id, node]))
  const parent = new Map<number, number>()
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id)
  const byPart = new Map<string, number>()
  let t = profile.startTime
  for (let i = 0; i < profile.samples.length; i++) {
    t += profile.timeDeltas[i] ?? 0
    // A sample stands for the time until the next one.
    const us = profile.timeDeltas[i + 1] ?? 0
    const frames: CallFrame[] = []
    for (let at: number | undefined = profile.samples[i]; at !== undefined; at = parent.get(at)) {
      frames.push((byId.get(at) as ProfileNode).callFrame)
    }
    const leaf = frames[0] as CallFrame
    if (t < fromUs || t > toUs || leaf.functionName === IDLE) continue
    const rule = frames.map(frame => RULES.find(r => matches(r, frame))).find(r => r !== undefined)
    const file = leaf.url.replace(/^file:\/\/.*?\/(node_modules|dist|bench)\//, '$1/')
    const part = rule?.label ?? `other: ${file === '' ? leaf.functionName : file}`
    byPart.set(part, (byPart.get(part) ?? 0) + us)
  }
  return byPart
}

interface Window {
  title: string
  fromUs: number
  toUs: number
  rps: number
  /** The process's CPU time per request, user and kernel, from /proc. */
  cpuUs: number
  budget: string
}

async function profileWindow (server: RunningServer, window: typeof WINDOWS[number], etag: string,
  postmasterPid: number): Promise<Window> {
  const { durationS, warmupS, connections } = settings()
  const headers = window.id === 'etag' ? { ...AUTH, 'if-none-match': etag } : AUTH
  const statement = window.kind === 'patch' ? 'update' : 'insert'
  const batchMetrics = ['sum', 'count'].map(part => `categories_${statement}_batch_rows_${part}`)
  const batches = async (): Promise<number[]> =>
    await Promise.all(batchMetrics.map(async name => await metricTotal(server, name)))
  const before = await batches()
  let start = { us: 0, cpu: { user: 0, system: 0, children: 0 }, db: 0 }
  const spec = { url: server.url, kind: window.kind, headers, connections, durationS, warmupS, updateRows: ROWS }
  const result = await runLoad(spec, () => {
    start = { us: nowUs(), cpu: cpuSplit(server.pid), db: postgresCpuSeconds(postmasterPid) }
  })
  const toUs = nowUs()
  const cpu = cpuSplit(server.pid)
  const db = postgresCpuSeconds(postmasterPid)
  const [rows = 0, statements = 0] = (await batches()).map((value, i) => value - (before[i] ?? 0))
  const perRequest = (s: number): string => `${(s * 1e6 / result.total).toFixed(1)} µs`
  const user = cpu.user - start.cpu.user
  const kernel = cpu.system - start.cpu.system
  const perStatement = statements === 0
    ? ''
    : `; ${(rows / statements).toFixed(1)} rows an ${statement.toUpperCase()} (warm-up included)`
  const budget = `CPU per request: the process ${perRequest(user)} in user space and ${perRequest(kernel)} in the ` +
    `kernel; PostgreSQL ${perRequest(db - start.db)}; wrk ${perRequest(result.cpuSeconds)}${perStatement}.`
  const cpuUs = (user + kernel) * 1e6 / result.total
  return { title: window.title, fromUs: start.us, toUs, rps: result.rps, cpuUs, budget }
}

function windowLines (window: Window, byPart: Map<string, number>): string[] {
  const busyUs = [...byPart.values()].reduce((total, us) => total + us, 0)
  const cells = (us: number): string[] =>
    [(us / busyUs * window.cpuUs).toFixed(2), `${(us / busyUs * 100).toFixed(1)} %`]
  return [
    `### ${window.title}: ${window.rps.toFixed(0)} req/s profiled, **${window.cpuUs.toFixed(2)} µs of CPU a request**`,
    '',
    window.budget,
    '',
    ...header(['part of the request path', 'µs/request', 'share']),
    ...[...byPart].sort((a, b) => b[1] - a[1]).map(([part, us]) => row([part.replace(/\|/g, '\\|'), ...cells(us)])),
    ''
  ]
}

export const profile: ScenarioGroup = {
  ids: ['profile'],
  run: async (postgres) => {
    const wanted = (process.env.PROFILE_SCENARIOS ?? 'get100,etag,post').split(',')
    await rm(OUT, { recursive: true, force: true })
    const nodeArgs = ['--cpu-prof', `--cpu-prof-dir=${OUT}`, `--cpu-prof-interval=${INTERVAL_US}`]
    const { server } = await startSeeded('service', postgres, ROWS, { label: 'profile', nodeArgs })
    const windows: Window[] = []
    try {
      const { etag } = await getList(server.url)
      for (const window of WINDOWS.filter(w => wanted.includes(w.id))) {
        windows.push(await profileWindow(server, window, etag, postgres.postmasterPid))
        log(`profile ${window.id}: ${windows.at(-1)?.rps.toFixed(0)} req/s`)
      }
    } finally {
      await server.stop() // the profile is written as the process exits
    }
    // CPU.<date>.<time>.<pid>.<thread>.<seq>.cpuprofile: the main thread is thread 0.
    const file = (await readdir(OUT)).find(f => /^CPU\.\d+\.\d+\.\d+\.0\.\d+\.cpuprofile$/.test(f))
    if (file === undefined) throw new Error(`no .cpuprofile in ${OUT}`)
    const cpuProfile = JSON.parse(await readFile(path.join(OUT, file), 'utf8')) as CpuProfile
    const lines = [
      `V8's sampling profiler every ${INTERVAL_US} µs; it slows the service: compare parts, not rates. CPU from /proc.`,
      '',
      ...windows.flatMap(window => windowLines(window, cut(cpuProfile, window.fromUs, window.toUs)))
    ]
    return { title: 'Where the time of a request goes', lines, verdicts: [] }
  }
}
