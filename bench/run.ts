/*
 * npm run bench: every scenario in one runner (bench/README.md). BENCH_SCENARIOS picks scenarios by id (the
 * side-by-side ones when unset); the runner starts PostgreSQL once, hands it to each scenario's group, and writes
 * one results.md with every verdict and each group's tables.
 */
import { mkdir, writeFile } from 'node:fs/promises'
import os from 'node:os'
import path from 'node:path'
import { type ScenarioGroup, type Section, buildSource, markdown } from './report.js'
import { bigList } from './scenarios/big-list.js'
import { compression } from './scenarios/compression.js'
import { fleet } from './scenarios/fleet.js'
import { profile } from './scenarios/profile.js'
import { sideBySide } from './scenarios/side-by-side.js'
import { soak } from './scenarios/soak.js'
import { tracing } from './scenarios/tracing.js'
import { ROOT, ensurePeers, log, startPostgres } from './servers.js'
import { ensureWrk } from './wrk.js'

const GROUPS: ScenarioGroup[] = [sideBySide, bigList, fleet, compression, tracing, soak, profile]

function chosenIds (): string[] {
  const asked = (process.env.BENCH_SCENARIOS ?? '').split(',').filter(id => id !== '')
  const known = GROUPS.flatMap(group => group.ids)
  const unknown = asked.filter(id => !known.includes(id))
  if (unknown.length > 0) throw new Error(`unknown scenario ${unknown.join(', ')}; known: ${known.join(', ')}`)
  if (asked.length > 0) return asked
  return GROUPS.filter(group => group.byDefault).flatMap(group => group.ids)
}

async function main (): Promise<void> {
  const began = new Date()
  const builtFrom = buildSource()
  const loadBefore = os.loadavg()
  const ids = chosenIds()
  const busy = (loadBefore[0] ?? 0) > os.availableParallelism() / 2
  if (busy) log(`the machine is busy (load average ${loadBefore[0]?.toFixed(1)}): expect noise`)
  const wrkVersion = ensureWrk()
  const servers = process.env.BENCH_SERVERS ?? ''
  const sideBySideWanted = ids.some(id => sideBySide.ids.includes(id))
  if (sideBySideWanted && (servers === '' || /bun|express|hono/.test(servers))) ensurePeers()
  const postgres = await startPostgres()
  log(`scenarios ${ids.join(', ')}; PostgreSQL ${postgres.version} (${postgres.source}) in ${postgres.workDir}`)
  const sections: Section[] = []
  try {
    for (const group of GROUPS) {
      const mine = group.ids.filter(id => ids.includes(id))
      if (mine.length > 0) sections.push(...await group.run({ postgres, runId: Date.now().toString(36) }, mine))
    }
  } finally {
    await postgres.stop()
  }
  const text = markdown({ began, builtFrom, loadBefore, postgres, wrkVersion }, sections)
  const outDir = process.env.BENCH_OUT ?? path.join(ROOT, 'bench')
  await mkdir(outDir, { recursive: true })
  await writeFile(path.join(outDir, 'results.md'), text)
  process.stdout.write(text)
  log(`wrote ${path.join(outDir, 'results.md')}`)
}

// An explicit exit: whatever a failed run left open (servers, timers) must not keep the process alive.
main().then(() => process.exit(0), (err: unknown) => {
  console.error(err)
  process.exit(1)
})
