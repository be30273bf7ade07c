/*
 * npm run bench:list-json: a cold list's build alone, without HTTP, hashing or the cache. BIG_ROWS categories
 * (1,000,000 by default, seeded as bench:big-list seeds them), in this build and, with BENCH_BASELINE_DIR, in that
 * checkout's build, alternating for LIST_ROUNDS rounds in one process:
 * - the JSON writer (src/db/json-copy.ts) alone, replaying PostgreSQL's binary COPY bytes of the rows, captured once
 *   in 64 KiB chunks: its CPU, without PostgreSQL's or the socket's noise;
 * - Table.listJson from PostgreSQL, after PostgreSQL's own COPY of the same rows: wall time and Node CPU.
 */
import path from 'node:path'
import { pathToFileURL } from 'node:url'
import pg from 'pg'
import { to as copyTo } from 'pg-copy-streams'
import { runMigrations } from '../src/db/migrate.js'
import { ROOT, copyMs, median, numberFromEnv, seedLongRows, startPostgres } from './servers.js'

type Modules = [typeof import('../src/db/database.js'), typeof import('../src/db/table.js'),
  typeof import('../src/db/json-copy.js')]

const ROWS = numberFromEnv('BIG_ROWS', 1_000_000)
const ROUNDS = numberFromEnv('LIST_ROUNDS', 6)
const COLUMNS = { name: 'text', description: 'text' }
const SELECT = 'SELECT id::bigint, name::text, description::text FROM categories ORDER BY id'
const cpuMs = (since: NodeJS.CpuUsage): number => { const { user, system } = process.cpuUsage(since); return (user + system) / 1000 }

async function build (dir: string): Promise<Modules> {
  const load = async (file: string): Promise<unknown> => await import(pathToFileURL(path.join(dir, 'dist', file)).href)
  return await Promise.all([load('db/database.js'), load('db/table.js'), load('db/json-copy.js')]) as Modules
}

async function copyBytes (databaseUrl: string): Promise<Buffer[]> {
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  try {
    const chunks: Buffer[] = []
    for await (const chunk of client.query(copyTo(`COPY (${SELECT}) TO STDOUT (FORMAT binary)`))) chunks.push(chunk as Buffer)
    const all = Buffer.concat(chunks)
    return Array.from({ length: Math.ceil(all.length / 65536) }, (_, i) => all.subarray(65536 * i, 65536 * (i + 1)))
  } finally {
    await client.end()
  }
}

async function main (): Promise<void> {
  const builds = [{ label: 'this build', modules: await build(ROOT) }]
  const baseline = process.env.BENCH_BASELINE_DIR
  if (baseline !== undefined && baseline !== '') builds.push({ label: 'baseline', modules: await build(baseline) })
  const postgres = await startPostgres()
  const results = new Map<string, Array<{ writerCpuMs: number, ms: number, cpuMs: number, ratio: number }>>()
  try {
    const databaseUrl = await postgres.createDatabase(`list_json_${Date.now().toString(36)}`)
    await runMigrations(databaseUrl, { info: () => {}, warn: () => {}, error: () => {} })
    await seedLongRows(databaseUrl, ROWS)
    const chunks = await copyBytes(databaseUrl)
    const replay = { query: () => chunks } as unknown as pg.ClientBase // what the writer iterates: the chunks
    for (let round = 0; round < ROUNDS; round++) {
      for (const { label, modules: [{ Database }, { Table }, { JsonCopyWriter }] } of round % 2 === 0 ? builds : [...builds].reverse()) {
        const writer = new JsonCopyWriter(COLUMNS, 1024, () => {})
        const writerCpu = process.cpuUsage()
        await writer.copy(replay, '')
        writer.finish()
        const writerCpuMs = cpuMs(writerCpu)

        const options = { connectionString: databaseUrl, applicationName: 'bench', max: 1, maxWaiting: 1 }
        const db = new Database({ ...options, connectionTimeoutMs: 5000, statementTimeoutMs: 60_000, log: () => {} })
        const table = new Table(db, 'categories', COLUMNS)
        const copy = await copyMs(databaseUrl)
        const cpu = process.cpuUsage()
        const started = performance.now()
        await table.listJson(1024, () => {})
        const ms = performance.now() - started
        const entry = { writerCpuMs, ms, cpuMs: cpuMs(cpu), ratio: ms / copy }
        await db.pool.end()
        results.set(label, [...results.get(label) ?? [], entry])
        process.stderr.write(`[list-json] round ${round + 1} ${label}: writer ${writerCpuMs.toFixed(0)} ms of CPU; listJson ` +
          `${entry.ms.toFixed(0)} ms, ${entry.cpuMs.toFixed(0)} ms of CPU, ${entry.ratio.toFixed(2)} × COPY (${copy.toFixed(0)} ms)\n`)
      }
    }
  } finally {
    await postgres.stop()
  }
  console.log(`${ROWS} rows, ${ROUNDS} rounds, medians\n\n| build | writer alone, CPU | listJson | its Node CPU | × COPY |\n|---|---:|---:|---:|---:|`)
  for (const [label, runs] of results) {
    const of = (pick: (run: typeof runs[number]) => number): string => median(runs.map(pick)).toFixed(0)
    console.log(`| ${label} | ${of(r => r.writerCpuMs)} ms | ${of(r => r.ms)} ms | ${of(r => r.cpuMs)} ms | ` +
      `${median(runs.map(r => r.ratio)).toFixed(2)} |`)
  }
}

await main()
