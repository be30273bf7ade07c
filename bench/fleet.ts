/*
 * The fleet scenario: N instances of one system on one database, each under its
 * own wrk (an even split of the load, as a balancer gives), all at once, on a
 * table of FLEET_ROWS rows: once with GETs only, once with one create in twenty.
 * The service and the naive peer each run as a fleet of 1 and of 2 (FLEET_SIZES).
 * For the service it reads every instance's list reads by source from its metrics:
 * a create on one instance must extend the other instances' lists, not make them
 * rebuild (refresh) them.
 */
import os from 'node:os'
import pg from 'pg'
import type { LoadResult } from './load.js'
import { AUTH, numberFromEnv, runToExit, seedBySql, startLoadGenerator, startPostgres, startServer, type RunningServer, type ServerKind } from './servers.js'

const settings = {
  rows: numberFromEnv('FLEET_ROWS', 100_000),
  durationS: numberFromEnv('FLEET_DURATION', 15),
  warmupS: numberFromEnv('FLEET_WARMUP', 3),
  connections: numberFromEnv('FLEET_CONNECTIONS', 20),
  sizes: (process.env.FLEET_SIZES ?? '1,2').split(',').map(Number),
  systems: (process.env.FLEET_SERVERS ?? 'service,naive').split(',') as ServerKind[]
}
const runId = Date.now().toString(36)

function log (message: string): void {
  process.stderr.write(`[fleet ${new Date().toISOString().slice(11, 19)}] ${message}\n`)
}

/** Deletes the rows a window created, so each window starts from the same table. */
async function restore (databaseUrl: string, rows: number): Promise<void> {
  const client = new pg.Client({ connectionString: databaseUrl })
  await client.connect()
  try {
    await client.query('DELETE FROM categories WHERE id > $1', [rows])
    await client.query('VACUUM categories')
  } finally {
    await client.end()
  }
}

type Sources = Record<string, number>

/** categories_list_reads_total by source, from one instance's metrics endpoint. */
async function readsBySource (server: RunningServer): Promise<Sources> {
  const text = await (await fetch(server.metricsUrl)).text()
  const sources: Sources = {}
  for (const match of text.matchAll(/^categories_list_reads_total\{source="(\w+)"\} (\d+)/gm)) sources[match[1] as string] = Number(match[2])
  return sources
}

function minus (after: Sources, before: Sources): Sources {
  return Object.fromEntries(Object.entries(after).map(([source, n]) => [source, n - (before[source] ?? 0)]))
}

interface Row { system: ServerKind, size: number, mix: 'GETs only' | '1 create in 20', results: LoadResult[], sources: Sources[] }

async function main (): Promise<void> {
  const load = await startLoadGenerator(log)
  const postgres = await startPostgres()
  log(`PostgreSQL ${postgres.version} (${postgres.source}); ${settings.rows} rows; ${settings.durationS} s windows after ${settings.warmupS} s warm-up; ${settings.connections} connections per instance`)
  const table: Row[] = []
  try {
    for (const system of settings.systems) {
      for (const size of settings.sizes) {
        const databaseUrl = await postgres.createDatabase(`fleet_${runId}_${system}_${size}`)
        const fleet: RunningServer[] = []
        try {
          for (let i = 0; i < size; i++) {
            fleet.push(await startServer(system, { databaseUrl, logLevel: 'info', workDir: postgres.workDir, label: `fleet-${system}-${size}-${i}` }))
            if (i === 0) await seedBySql(databaseUrl, settings.rows)
          }
          for (const mix of ['GETs only', '1 create in 20'] as const) {
            // Every instance's list built before the window, as after any start.
            await Promise.all(fleet.map(async server => { await (await fetch(`${server.url}/v1/categories`, { headers: AUTH })).arrayBuffer() }))
            const before = system === 'service' ? await Promise.all(fleet.map(readsBySource)) : []
            const results = await Promise.all(fleet.map(async (server, i) => await load.run({
              url: server.url,
              kind: mix === 'GETs only' ? 'get' : 'mixed',
              path: '/v1/categories',
              headers: { ...AUTH },
              connections: settings.connections,
              durationS: settings.durationS,
              warmupS: settings.warmupS,
              rate: 0,
              postEvery: 20,
              namePrefix: `fleet-${runId}-${system}-${size}-${i}`
            }, () => {})))
            const sources = system === 'service' ? await Promise.all(fleet.map(async (server, i) => minus(await readsBySource(server), before[i] as Sources))) : []
            table.push({ system, size, mix, results, sources })
            const sum = results.reduce((total, r) => total + r.rps, 0)
            log(`${system} ×${size}, ${mix}: ${sum.toFixed(0)} req/s (${results.map(r => r.rps.toFixed(0)).join(' + ')}), p99 ${results.map(r => `${r.p99} ms`).join(' / ')}, failures ${results.reduce((n, r) => n + r.socketErrors + (r.statusCounts['4xx-5xx'] ?? 0), 0)}${sources.length > 0 ? `, reads by source ${sources.map(s => JSON.stringify(s)).join(' and ')}` : ''}`)
            if (mix !== 'GETs only') await restore(databaseUrl, settings.rows)
          }
        } finally {
          for (const server of fleet) await server.stop()
        }
      }
    }
  } finally {
    await load.stop()
    await postgres.stop()
  }
  const lines = [
    `Fleet: ${settings.rows} rows, ${settings.durationS} s windows (after ${settings.warmupS} s warm-up), ${settings.connections} wrk connections per instance, ${os.availableParallelism()} cores, load average after ${os.loadavg().map(l => l.toFixed(1)).join(' ')}`,
    '',
    '| system | instances | mix | summed req/s | per instance | p99 | failures | list reads by source per instance (cache / appended / refresh / database) |',
    '|---|---:|---|---:|---|---|---:|---|'
  ]
  for (const row of table) {
    const sum = row.results.reduce((total, r) => total + r.rps, 0)
    const failures = row.results.reduce((n, r) => n + r.socketErrors + (r.statusCounts['4xx-5xx'] ?? 0), 0)
    const sources = row.sources.map(s => ['cache', 'appended', 'refresh', 'database'].map(k => s[k] ?? 0).join(' / ')).join(' and ')
    lines.push(`| ${row.system} | ${row.size} | ${row.mix} | ${sum.toFixed(0)} | ${row.results.map(r => r.rps.toFixed(0)).join(' + ')} | ${row.results.map(r => `${r.p99} ms`).join(' / ')} | ${failures} | ${sources} |`)
  }
  lines.push('')
  for (const size of settings.sizes) {
    const rate = (mix: Row['mix']): Row | undefined => table.find(r => r.system === 'service' && r.size === size && r.mix === mix)
    const gets = rate('GETs only')
    const mixed = rate('1 create in 20')
    if (gets === undefined || mixed === undefined) continue
    const sum = (row: Row): number => row.results.reduce((total, r) => total + r.rps, 0)
    const p99 = (row: Row): number => Math.max(...row.results.map(r => r.p99))
    lines.push(`service ×${size}: with creates ${(sum(mixed) / sum(gets)).toFixed(2)} × the GETs-only rate (target ≥ 0.9), worst p99 ${(p99(mixed) / p99(gets)).toFixed(2)} × (target ≤ 1.5)`)
  }
  process.stdout.write(lines.join('\n') + '\n')
}

await runToExit(main)
