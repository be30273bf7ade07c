/*
 * npm run bench:profile: where every microsecond of a request goes. Starts the
 * service (as the bench does: npm start's flags, metrics on, LOG_LEVEL=info)
 * and the raw node:http limit with --cpu-prof, puts each under the same wrk
 * load as the bench (GET /v1/categories with 100 rows, the same GET with
 * If-None-Match, then POST /v1/categories with unique names; PROFILE_SCENARIOS
 * picks among get100, etag and post), and prints, per server and scenario, the CPU time per
 * request by part of the request path (bench/cpu-profile.ts) and the top
 * functions by self time. The measured windows are cut out of each profile by
 * time: V8's profile clock and process.hrtime are both CLOCK_MONOTONIC.
 * Writes PROFILE_OUT/profile.md, the .cpuprofile files (open them in Chrome
 * DevTools or speedscope) and a .folded file per window for flame graph tools.
 */
import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { analyse, perRequestTable, type CpuProfile } from './cpu-profile.js'
import { AUTH, ROOT, numberFromEnv, profileRows, publishReport, runToExit, startLoadGenerator, startPostgres, startSeededServer, type ServerKind } from './servers.js'

const settings = {
  durationS: numberFromEnv('PROFILE_DURATION', 10),
  warmupS: numberFromEnv('PROFILE_WARMUP', 3),
  intervalUs: numberFromEnv('PROFILE_INTERVAL_US', 250),
  outDir: path.resolve(process.env.PROFILE_OUT ?? path.join(ROOT, 'bench', '.tmp', 'profiles')),
  servers: (process.env.PROFILE_SERVERS ?? 'raw,service').split(',').filter(s => s !== '') as ServerKind[],
  scenarios: (process.env.PROFILE_SCENARIOS ?? 'get100,etag,post').split(',').filter(s => s !== '')
}

const log = (message: string): void => { process.stderr.write(`[profile] ${message}\n`) }
const nowUs = (): number => Number(process.hrtime.bigint() / 1000n)

const TITLES: Record<string, string> = { get100: 'GET list, 100 rows', etag: 'GET with If-None-Match (304)', post: 'POST, 50 connections (after the GETs, on the same 100-row table)' }

interface Window { server: ServerKind, scenario: string, fromUs: number, toUs: number, requests: number, rps: number, note: string | undefined }

interface Batches { rows: number, inserts: number }

/** categories_insert_batch_rows' sum and count, or undefined for a server without it. */
async function insertBatches (metricsUrl: string): Promise<Batches | undefined> {
  const text = await fetch(metricsUrl).then(async r => r.ok ? await r.text() : '', () => '')
  const value = (name: string): number | undefined => {
    const line = text.split('\n').find(l => l.startsWith(`${name} `))
    return line === undefined ? undefined : Number(line.split(' ')[1])
  }
  const rows = value('categories_insert_batch_rows_sum')
  const inserts = value('categories_insert_batch_rows_count')
  return rows === undefined || inserts === undefined ? undefined : { rows, inserts }
}

async function batchNote (metricsUrl: string, before: Batches | undefined): Promise<string | undefined> {
  const after = await insertBatches(metricsUrl)
  if (before === undefined || after === undefined || after.inserts === before.inserts) return undefined
  const rows = after.rows - before.rows
  const inserts = after.inserts - before.inserts
  return `Group commit over this window and its warm-up: ${rows} rows in ${inserts} INSERTs, ${(rows / inserts).toFixed(1)} rows per INSERT on average.`
}

async function main (): Promise<void> {
  await mkdir(settings.outDir, { recursive: true })
  const load = await startLoadGenerator(log, 'wrk')
  const postgres = await startPostgres()
  const windows: Window[] = []
  const rows = await profileRows(postgres, 100)
  try {
    for (const kind of settings.servers) {
      const profileDir = path.join(settings.outDir, kind)
      await mkdir(profileDir, { recursive: true })
      for (const old of await readdir(profileDir)) if (old.endsWith('.cpuprofile')) await rm(path.join(profileDir, old))
      const { server, etag } = await startSeededServer(kind, postgres, rows, {
        databasePrefix: 'profile',
        label: `${kind}-profile`,
        nodeArgs: ['--cpu-prof', `--cpu-prof-dir=${profileDir}`, `--cpu-prof-interval=${settings.intervalUs}`]
      })
      try {
        for (const [scenario, loadKind, headers] of [['get100', 'get', AUTH], ['etag', 'get', { ...AUTH, 'if-none-match': etag }], ['post', 'post', AUTH]] as const) {
          if (!settings.scenarios.includes(scenario)) continue
          let fromUs = 0
          // Rows per group-commit INSERT over the POST window (warm-up included): the service's own histogram.
          const batchesBefore = scenario === 'post' ? await insertBatches(server.metricsUrl) : undefined
          const result = await load.run({ url: server.url, kind: loadKind, path: '/v1/categories', headers, connections: 50, durationS: settings.durationS, warmupS: settings.warmupS, rate: 0, postEvery: 20, namePrefix: `profile-${Date.now().toString(36)}` }, () => { fromUs = nowUs() })
          const toUs = nowUs()
          windows.push({ server: kind, scenario, fromUs, toUs, requests: result.total, rps: result.rps, note: scenario === 'post' ? await batchNote(server.metricsUrl, batchesBefore) : undefined })
          log(`${kind} ${scenario}: ${Math.round(result.rps)} req/s, ${result.bytesPerResponse} bytes per response, failures ${result.socketErrors + (result.statusCounts['4xx-5xx'] ?? 0)}`)
        }
      } finally {
        await server.stop() // the profile is written as the process exits
      }
    }
  } finally {
    await load.stop()
    await postgres.stop()
  }

  const report: string[] = ['# Where the CPU time of a request goes', '', `wrk, 50 connections, ${settings.durationS} s per window after ${settings.warmupS} s of warm-up, sampling every ${settings.intervalUs} µs (node ${process.version}). Profiling slows every server a little; compare the parts, not the throughput.`, '']
  for (const kind of settings.servers) {
    const dir = path.join(settings.outDir, kind)
    // CPU.<date>.<time>.<pid>.<thread>.<seq>.cpuprofile: the main thread is thread 0 (tsx's loader thread writes its own).
    const file = (await readdir(dir)).filter(f => /^CPU\.\d+\.\d+\.\d+\.0\.\d+\.cpuprofile$/.test(f)).sort().at(-1)
    if (file === undefined) throw new Error(`no .cpuprofile in ${dir}`)
    const profile = JSON.parse(await readFile(path.join(dir, file), 'utf8')) as CpuProfile
    for (const w of windows.filter(x => x.server === kind)) {
      if (w.fromUs < profile.startTime || w.toUs > profile.endTime) throw new Error(`the ${kind} ${w.scenario} window is outside its profile: the clocks differ`)
      const cut = analyse(profile, w.fromUs, w.toUs)
      await writeFile(path.join(dir, `${w.scenario}.folded`), [...cut.folded].map(([stack, us]) => `${stack} ${Math.round(us)}`).join('\n') + '\n')
      report.push(`## ${kind}, ${TITLES[w.scenario] ?? w.scenario}: ${Math.round(w.rps)} req/s under the profiler`, '', ...(w.note === undefined ? [] : [w.note, '']), perRequestTable(cut, w.requests), '')
    }
  }
  await publishReport(settings.outDir, 'profile.md', report, log)
}

await runToExit(main)
