/* What every scenario shares: its settings, its section of results.md, and the verdicts on its targets. */
import { execFileSync } from 'node:child_process'
import os from 'node:os'
import { type Postgres, ROOT, numberFromEnv } from './servers.js'
import { benchServiceNodeArgs } from './start-command.js'

export interface Settings {
  durationS: number
  warmupS: number
  rounds: number
  connections: number
}

const DEFAULTS: Settings = { durationS: 10, warmupS: 3, rounds: 1, connections: 50 }

/** BENCH_DURATION, BENCH_WARMUP, BENCH_ROUNDS and BENCH_CONNECTIONS, else the scenario's own defaults, else ours. */
export function settings (own: Partial<Settings> = {}): Settings {
  const base = { ...DEFAULTS, ...own }
  return {
    durationS: numberFromEnv('BENCH_DURATION', base.durationS),
    warmupS: numberFromEnv('BENCH_WARMUP', base.warmupS),
    rounds: Math.max(1, Math.round(numberFromEnv('BENCH_ROUNDS', base.rounds))),
    connections: numberFromEnv('BENCH_CONNECTIONS', base.connections)
  }
}

export interface Verdict {
  scenario: string
  target: string
  measured: string
  /** undefined: not measured in this run. */
  met: boolean | undefined
}

export interface Section {
  title: string
  lines: string[]
  verdicts: Verdict[]
}

export interface Context {
  postgres: Postgres
  /** Names databases and created rows apart from other runs. */
  runId: string
}

/** A group of scenarios that share their servers: run with the ids of it that were asked for. */
export interface ScenarioGroup {
  ids: string[]
  /** Run when BENCH_SCENARIOS is unset. */
  byDefault: boolean
  run: (context: Context, ids: string[]) => Promise<Section[]>
}

export const ratioText = (value: number | undefined): string => value === undefined ? 'n/a' : value.toFixed(2)
export const mb = (bytes: number): string => (bytes / 2 ** 20).toFixed(0)
export const sum = (values: number[]): number => values.reduce((total, value) => total + value, 0)

/** The list in the order of a round: each round starts one later, so that drifting load hits every entry alike. */
export const rotate = <T>(list: T[], round: number): T[] =>
  [...list.slice(round % list.length), ...list.slice(0, round % list.length)]

function verdictText (met: boolean | undefined): string {
  if (met === undefined) return 'not measured'
  return met ? '**met**' : '**not met**'
}

/** `git status --porcelain`: two status letters and a space before each path. */
const PORCELAIN_PATH_AT = 3

function git (...args: string[]): string {
  try {
    return execFileSync('git', args, { cwd: ROOT, encoding: 'utf8' }).trimEnd()
  } catch {
    return 'unknown'
  }
}

/** The commit the service was built from (and uncommitted files under src/ and migrations/), read as the run began. */
export function buildSource (): string {
  const dirty = git('status', '--porcelain', '--', 'src', 'migrations')
  const files = dirty.split('\n').map(line => line.slice(PORCELAIN_PATH_AT)).join(', ')
  return `\`${git('log', '-1', '--format=%h %s')}\`${dirty === '' ? '' : `, plus uncommitted changes in ${files}`}`
}

/** The settings a run was made with, as they go before `npm run bench`. */
const SETTING = /^(BENCH|BIG|PAGE|FLEET|COMPRESSION|SOAK|PROFILE|WRITES)_|^DB_POOL_MAX$/

interface RunInfo {
  began: Date
  builtFrom: string
  loadBefore: number[]
  postgres: Postgres
  wrkVersion: string
}

/** results.md: how the run was made, every verdict in one table, then each scenario's section. */
export function markdown (info: RunInfo, sections: Section[]): string {
  const variables = Object.entries(process.env).filter(([name, value]) => SETTING.test(name) && value !== '')
  const command = [...variables.map(([name, value]) => `${name}=${value ?? ''}`), 'npm run bench'].join(' ')
  const loads = (values: number[]): string => values.map(value => value.toFixed(2)).join(' ')
  const service = ['node', ...benchServiceNodeArgs(), 'dist/server.js'].join(' ')
  const verdicts = sections.flatMap(section => section.verdicts)
  return [
    '# Benchmark results',
    '',
    'Written by `npm run bench` (bench/run.ts); how to read it: bench/README.md.',
    '',
    `- command: \`${command}\``,
    `- date: ${info.began.toISOString()} to ${new Date().toISOString()}`,
    `- machine: ${os.availableParallelism()} CPUs, ${os.cpus()[0]?.model ?? 'unknown'}, ${mb(os.totalmem())} MB RAM`,
    `- load average (1, 5, 15 min) before ${loads(info.loadBefore)}, after ${loads(os.loadavg())}`,
    `- node ${process.version}; PostgreSQL ${info.postgres.version} (${info.postgres.source})`,
    `- load generator: ${info.wrkVersion}; everything on 127.0.0.1`,
    `- service built from ${info.builtFrom}`,
    `- service: \`${service}\`, NODE_ENV=production, LOG_LEVEL=info, metrics on, SHUTDOWN_DRAIN_MS=0`,
    '',
    '## Targets',
    '',
    '| scenario | target | measured | verdict |',
    '|---|---|---|---|',
    ...verdicts.map(v => `| ${v.scenario} | ${v.target} | ${v.measured} | ${verdictText(v.met)} |`),
    '',
    ...sections.flatMap(section => [`## ${section.title}`, '', ...section.lines, '']),
    ''
  ].join('\n')
}
