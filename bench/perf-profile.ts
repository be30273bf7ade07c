/*
 * npm run bench:perf: where a request's CPU time goes, kernel included, with
 * Linux perf. V8's --cpu-prof (npm run bench:profile) sees only the JavaScript
 * thread, and charges a system call's kernel time to the JavaScript function
 * that made it: on Node 20 it put 92 % of a 304 in writeLatin1String. perf
 * samples the whole process, kernel and native code too, and --perf-basic-prof
 * names the JIT code.
 *
 * For each of PERF_PROCESSES rounds it starts every server of PERF_SERVERS
 * afresh (as the bench does: npm start's flags, metrics on, LOG_LEVEL=info),
 * puts it under the bench's wrk load (PERF_SCENARIOS: get100, etag) and records
 * the process with `perf record` for the measured window. A new process each
 * round, because a process keeps its cost per request: two processes of the
 * same build can differ by a fifth (docs/performance.md). It prints, per
 * scenario, the CPU time per request of each process split into the kernel,
 * node's native code (V8, its builtins and GC, libuv, llhttp), JIT-compiled
 * JavaScript and libc, and the top symbols of the cheapest and dearest
 * process of each server. Needs perf (Debian: linux-perf) and the right to
 * profile a process (root, or kernel.perf_event_paranoid ≤ 1).
 * Writes PERF_OUT/perf.md, the perf.data files and V8's logs.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process'
import { once } from 'node:events'
import { mkdir, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { AUTH, ROOT, numberFromEnv, profileRows, publishReport, runToExit, startLoadGenerator, startPostgres, startSeededServer, type ServerKind } from './servers.js'

const settings = {
  durationS: numberFromEnv('PERF_DURATION', 5),
  warmupS: numberFromEnv('PERF_WARMUP', 2),
  processes: Math.max(1, numberFromEnv('PERF_PROCESSES', 3)),
  frequency: numberFromEnv('PERF_FREQUENCY', 1999),
  outDir: path.resolve(process.env.PERF_OUT ?? path.join(ROOT, 'bench', '.tmp', 'perf')),
  servers: (process.env.PERF_SERVERS ?? 'raw,service').split(',').filter(s => s !== '') as ServerKind[],
  scenarios: (process.env.PERF_SCENARIOS ?? 'etag,get100').split(',').filter(s => s !== ''),
  /** PERF_HOOKS=1: call chains too (perf record -g), and the µs of every per-request hook, its callees included. */
  hooks: process.env.PERF_HOOKS === '1'
}

/**
 * The service's per-request parts, by the JavaScript function (file and name, as --perf-basic-prof writes them)
 * nearest the sampled frame. What a hook's `done` runs next (the following hook, the handler, the write: V8 may
 * inline Fastify's `next` into the hook) is not the hook's: Fastify's continuation frames end the search.
 */
const HOOK_PARTS: Array<[string, RegExp]> = [
  ['Fastify: the hook runner continues', /^JS:\W?(next|hookIterator|onResponseHookIterator|onResponseCallback|runPreParsing|handleRequest|preHandlerCallback|wrapOnSendEnd) .*fastify\/lib\//],
  ['Fastify: sending and writing the response', /^JS:\W?(Reply\.send|onSendEnd) /],
  ['onRequest httpRules (protocol.ts: HTTP/1.1 rules, repeated headers)', /^JS:\W?(httpRules|repeatedSingleton) /],
  ['onRequest access (auth.ts: bearer-auth, SHA-256, limits)', /^JS:\W?access .*dist\/http\/auth\.js/],
  ['onRequest methodNotAllowed (method-not-allowed.ts)', /^JS:\W?methodNotAllowed /],
  ['onSend responseHeaders (lifecycle.ts)', /^JS:\W?responseHeaders /],
  ['onResponse requestCompleted (metrics.ts: histogram, access log)', /^JS:\W?requestCompleted .*dist\/http\/metrics\.js/],
  ['genReqId requestId (lifecycle.ts)', /^JS:\W?requestId .*dist\/http\/lifecycle\.js/],
  ['rewriteUrl originForm (protocol.ts)', /^JS:\W?originForm /],
  ["'request' listener: the connection's latest response (protocol.ts)", /^JS:\W? \S*dist\/http\/protocol\.js:\d+/],
  ['Fastify: the per-request child logger (pino)', /^JS:\W?createChildLogger /],
  ['handler sendResourceList and the list cache read (replies.ts, src/machinery)', /^JS:\W?(sendResourceList|list|read) .*dist\/(http\/replies|machinery)/]
]

/** Samples by part of HOOK_PARTS (call chains from `perf script`, leaf first); the rest as "everything else". */
function readHookParts (file: string): Map<string, number> {
  const text = execFileSync('perf', ['script', '-i', file, '-F', 'ip,sym'], { encoding: 'utf8', maxBuffer: 1024 * 1024 * 1024, stdio: ['ignore', 'pipe', 'ignore'] })
  const parts = new Map<string, number>()
  for (const sample of text.split('\n\n')) {
    const frames = sample.split('\n').map(line => line.trim().replace(/^[0-9a-f]+ /, '')).filter(f => f !== '')
    if (frames.length === 0) continue
    let part = 'everything else'
    for (const frame of frames) {
      const found = HOOK_PARTS.find(([, pattern]) => pattern.test(frame))
      if (found !== undefined) {
        part = found[0] === 'Fastify: the hook runner continues' ? 'everything else' : found[0]
        break
      }
    }
    parts.set(part, (parts.get(part) ?? 0) + 1)
  }
  return parts
}

const TITLES: Record<string, string> = { get100: 'GET list, 100 rows', etag: 'GET with If-None-Match (304)' }
const PARTS = ['kernel', 'node native', 'JavaScript (JIT)', 'libc and other'] as const
type Part = typeof PARTS[number]

const log = (message: string): void => { process.stderr.write(`[perf] ${message}\n`) }

interface Sample { server: ServerKind, round: number, scenario: string, rps: number, requests: number, report: Report, hooks?: Map<string, number> }

function partOf (dso: string): Part {
  if (dso === '[kernel.kallsyms]') return 'kernel'
  if (dso === 'node' || dso.endsWith('/node')) return 'node native'
  // --perf-basic-prof's map: perf names it "[JIT] tid <pid>" (or the map file itself).
  if (dso.startsWith('[JIT]') || dso.startsWith('perf-')) return 'JavaScript (JIT)'
  return 'libc and other'
}

interface Report { parts: Map<Part, number>, symbols: Map<string, number>, total: number }

/**
 * Samples by part and by symbol, from `perf report` (self time, no call chains).
 * Read while the server's --perf-basic-prof map still exists: it names the JIT code.
 */
function readReport (file: string): Report {
  const text = execFileSync('perf', ['report', '-i', file, '--no-children', '--sort', 'dso,sym', '-g', 'none', '-n', '--stdio', '--field-separator', '\t'], { encoding: 'utf8', maxBuffer: 256 * 1024 * 1024, stdio: ['ignore', 'pipe', 'ignore'] })
  const parts = new Map<Part, number>(PARTS.map(p => [p, 0]))
  const symbols = new Map<string, number>()
  let total = 0
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || line.trim() === '') continue
    // overhead, samples, dso, symbol ("[k] name" or "[.] name")
    const [, count, dso, symbol] = line.split('\t')
    const samples = Number(count)
    if (!Number.isFinite(samples) || dso === undefined || symbol === undefined) continue
    total += samples
    const part = partOf(dso.trim())
    parts.set(part, (parts.get(part) ?? 0) + samples)
    const name = symbol.trim().replace(/^\[[.k]\] /, '')
    symbols.set(name, (symbols.get(name) ?? 0) + samples)
  }
  return { parts, symbols, total }
}

function ensurePerf (): void {
  const run = spawnSync('perf', ['--version'], { encoding: 'utf8' })
  if (run.error !== undefined || run.status !== 0) throw new Error('perf is not installed (Debian: apt-get install linux-perf)')
}

/** Records the process for the measured window; resolves when perf has written its file. */
async function record (pid: number, file: string, seconds: number): Promise<void> {
  const perf = spawn('perf', ['record', '-F', String(settings.frequency), ...(settings.hooks ? ['-g'] : []), '-p', String(pid), '-o', file, '--', 'sleep', String(seconds)], { stdio: ['ignore', 'ignore', 'pipe'] })
  let stderr = ''
  perf.stderr.on('data', (chunk: Buffer) => { stderr += chunk.toString() })
  const [code] = await once(perf, 'exit') as [number | null]
  if (code !== 0) throw new Error(`perf record failed (${code}): ${stderr.trim().split('\n').at(-1) ?? ''}`)
}

async function main (): Promise<void> {
  ensurePerf()
  await mkdir(settings.outDir, { recursive: true })
  const load = await startLoadGenerator(log, 'wrk')
  const postgres = await startPostgres()
  const rows = await profileRows(postgres, 100)
  const samples: Sample[] = []
  try {
    for (let round = 1; round <= settings.processes; round++) {
      for (const kind of settings.servers) {
        const { server, etag } = await startSeededServer(kind, postgres, rows, {
          databasePrefix: 'perf',
          label: `${kind}-perf-${round}`,
          // --perf-basic-prof also opens V8's log (isolate-*.log in the working directory): keep it with the results.
          nodeArgs: ['--perf-basic-prof', `--logfile=${path.join(settings.outDir, `${kind}-${round}.v8.log`)}`, '--no-logfile-per-isolate']
        })
        try {
          for (const [scenario, headers] of [['get100', AUTH], ['etag', { ...AUTH, 'if-none-match': etag }]] as const) {
            if (!settings.scenarios.includes(scenario)) continue
            const file = path.join(settings.outDir, `${kind}-${scenario}-${round}.perf.data`)
            let recording: Promise<void> | undefined
            const result = await load.run({ url: server.url, kind: 'get', path: '/v1/categories', headers, connections: 50, durationS: settings.durationS, warmupS: settings.warmupS, rate: 0, postEvery: 20, namePrefix: 'perf' }, () => {
              // A little shorter than the window, so every sample falls inside it.
              recording = record(server.pid, file, Math.max(1, settings.durationS - 0.5))
            })
            if (recording === undefined) throw new Error('the load generator never began its measured window')
            await recording
            samples.push({ server: kind, round, scenario, rps: result.rps, requests: result.rps * Math.max(1, settings.durationS - 0.5), report: readReport(file), ...(settings.hooks && kind !== 'raw' ? { hooks: readHookParts(file) } : {}) })
            log(`${kind} ${scenario} process ${round}: ${Math.round(result.rps)} req/s`)
          }
        } finally {
          await server.stop()
          // --perf-basic-prof's symbol map (function names only), read by now: the perf.data files keep native and kernel names.
          await rm(path.join(tmpdir(), `perf-${server.pid}.map`), { force: true })
        }
      }
    }
  } finally {
    await load.stop()
    await postgres.stop()
  }

  const usPerSample = 1e6 / settings.frequency
  const report: string[] = ['# Where the CPU time of a request goes, kernel included (Linux perf)', '',
    `wrk, 50 connections, ${settings.durationS} s per window after ${settings.warmupS} s of warm-up; perf samples each server process ${settings.frequency} times a second (node ${process.version}). Each process is a new one. µs of CPU per request, from the samples; req/s under the profiler.`, '']
  for (const scenario of settings.scenarios) {
    const these = samples.filter(s => s.scenario === scenario)
    if (these.length === 0) continue
    report.push(`## ${TITLES[scenario] ?? scenario}`, '', `| server | process | req/s | µs/request | ${PARTS.join(' | ')} |`, `|---|---:|---:|---:|${PARTS.map(() => '---:').join('|')}|`)
    for (const r of these) {
      const us = (n: number): string => (n * usPerSample / r.requests).toFixed(2)
      report.push(`| ${r.server} | ${r.round} | ${Math.round(r.rps)} | ${us(r.report.total)} | ${PARTS.map(p => us(r.report.parts.get(p) ?? 0)).join(' | ')} |`)
    }
    report.push('')
    for (const kind of settings.servers) {
      const mine = these.filter(r => r.server === kind).sort((a, b) => a.report.total / a.requests - b.report.total / b.requests)
      const picks = mine.length > 1 ? [mine[0], mine.at(-1)] : [mine[0]]
      for (const r of picks) {
        if (r === undefined) continue
        const top = [...r.report.symbols].sort((a, b) => b[1] - a[1]).slice(0, 15)
        report.push(`${kind}, process ${r.round} (${mine.length > 1 && r === mine[0] ? 'cheapest' : mine.length > 1 ? 'dearest' : 'only'}), top symbols by self time:`, '', '| symbol | µs/request |', '|---|---:|',
          ...top.map(([name, n]) => `| ${name.replaceAll('|', '\\|').slice(0, 100)} | ${(n * usPerSample / r.requests).toFixed(3)} |`), '')
      }
    }
  }
  if (settings.hooks) {
    report.push('## Per-request parts, callees (native code and kernel) included', '', 'µs of CPU per request, each process of each server and scenario; "everything else" is Node\'s HTTP, Fastify\'s own work, GC and the kernel outside these calls.', '')
    for (const r of samples.filter(s => s.hooks !== undefined)) {
      const hooks = r.hooks as Map<string, number>
      report.push(`${r.server}, ${TITLES[r.scenario] ?? r.scenario}, process ${r.round}: ${(r.report.total * usPerSample / r.requests).toFixed(2)} µs/request`, '', '| part | µs/request |', '|---|---:|',
        ...[...hooks].sort((a, b) => b[1] - a[1]).map(([name, n]) => `| ${name} | ${(n * usPerSample / r.requests).toFixed(2)} |`), '')
    }
  }
  await publishReport(settings.outDir, 'perf.md', report, log)
}

await runToExit(main)
