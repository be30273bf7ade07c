// npm run bench: every scenario in one runner (bench/README.md).
import { spawnSync } from 'node:child_process'
import { writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { type ScenarioGroup, type Section, row } from './report.js'
import { bigList } from './scenarios/big-list.js'
import { compression } from './scenarios/compression.js'
import { fleet } from './scenarios/fleet.js'
import { profile } from './scenarios/profile.js'
import { sideBySide } from './scenarios/side-by-side.js'
import { soak } from './scenarios/soak.js'
import { tracing } from './scenarios/tracing.js'
import { ROOT, WORK_DIR, log, startPostgres } from './servers.js'
import { serviceNodeFlags } from './start-command.js'
import { ensureWrk } from './wrk.js'

const GROUPS: ScenarioGroup[] = [sideBySide, bigList, fleet, compression, tracing, soak, profile]
const OUT = path.join(ROOT, 'bench', '.tmp', 'results.md')
/** The settings a run was made with, as they go before `npm run bench`. */
const SETTING = /^(BENCH|BIG|PAGE|FLEET|COMPRESSION|SOAK|PROFILE)_/

function chosenIds (): string[] {
  const asked = (process.env.BENCH_SCENARIOS ?? '').split(',').filter(id => id !== '')
  const known = GROUPS.flatMap(group => group.ids)
  const unknown = asked.filter(id => !known.includes(id))
  if (unknown.length > 0) throw new Error(`unknown scenario ${unknown.join(', ')}; known: ${known.join(', ')}`)
  return asked.length > 0 ? asked : sideBySide.ids
}

const loadAverages = (): string => os.loadavg().map(value => value.toFixed(2)).join(' ')

function verdictText (met: boolean | undefined): string {
  if (met === undefined) return 'not measured'
  return met ? '**met**' : '**not met**'
}

async function main (): Promise<void> {
  const began = new Date().toISOString()
  const loadBefore = loadAverages()
  const builtFrom = spawnSync('git', ['describe', '--always', '--dirty'], { cwd: ROOT, encoding: 'utf8' }).stdout
  const ids = chosenIds()
  if ((os.loadavg()[0] ?? 0) > os.availableParallelism() / 2) log(`the machine is busy (${loadBefore}): expect noise`)
  const wrkVersion = ensureWrk()
  const postgres = await startPostgres()
  log(`scenarios ${ids.join(', ')}; logs in ${WORK_DIR}`)
  const sections: Section[] = []
  try {
    for (const group of GROUPS) {
      const mine = group.ids.filter(id => ids.includes(id))
      if (mine.length > 0) sections.push(await group.run(postgres, mine))
    }
  } finally {
    await postgres.stop()
  }
  const variables = Object.entries(process.env).filter(([name, value]) => SETTING.test(name) && value !== '')
  const command = [...variables.map(([name, value]) => `${name}=${value ?? ''}`), 'npm run bench'].join(' ')
  const service = ['node', ...serviceNodeFlags(), 'dist/server.js'].join(' ')
  const text = [
    '# Benchmark results',
    '',
    `- \`${command}\`, ${began} to ${new Date().toISOString()}`,
    `- ${os.availableParallelism()} CPUs (${os.cpus()[0]?.model ?? 'unknown'}), load average before ${loadBefore}, ` +
      `after ${loadAverages()}`,
    `- node ${process.version}; PostgreSQL ${postgres.version} (embedded); ${wrkVersion}; everything on 127.0.0.1`,
    `- the service built from ${builtFrom.trim()}: \`${service}\`, NODE_ENV=production, LOG_LEVEL=info`,
    '',
    row(['scenario', 'target', 'measured', 'verdict']),
    row(['---', '---', '---', '---']),
    ...sections.flatMap(s => s.verdicts).map(v => row([v.scenario, v.target, v.measured, verdictText(v.met)])),
    '',
    ...sections.flatMap(section => [`## ${section.title}`, '', ...section.lines, ''])
  ].join('\n')
  await writeFile(OUT, text)
  process.stdout.write(text)
  log(`wrote ${OUT}`)
}

// An explicit exit: whatever a failed run left open (servers, timers) must not keep the process alive.
main().then(() => process.exit(0), (err: unknown) => {
  console.error(err)
  process.exit(1)
})
