import { existsSync } from 'node:fs'
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import t, { type Test } from 'tap'
import { isAlive, lockDataDir } from '@petstore/embedded-postgres'
import { freePort } from './helpers/ports.js'
import { until } from './helpers/until.js'
import { categoriesRequest, startServer, type ServerProcess } from './helpers/server-process.js'

/*
 * One data directory, one petstore process: a second start on it is refused and
 * leaves the first alone; a postgres is stopped only when the petstore process that
 * started it is gone (an orphan).
 */

t.setTimeout(240000)

async function dataDir (): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), 'petstore-owner-'))
  t.teardown(async () => {
    await rm(dir, { recursive: true, force: true })
  })
  return dir
}

/** Starts that read the lock while its owner rewrites it: enough to meet a half-written file often. */
const LOCK_READS = 2000

async function lockOf (dir: string): Promise<{ pid: number; postgresPid: number }> {
  return JSON.parse(await readFile(path.join(dir, 'petstore.lock'), 'utf8'))
}

async function keyOf (dir: string): Promise<string> {
  return (await readFile(path.join(dir, 'dev-api-key'), 'utf8')).trim()
}

function stackFree (output: string): boolean {
  return !/\n\s+at .+:\d+/.test(output)
}

t.test(
  'a second start on the same DATA_DIR (another PORT, the same METRICS_PORT) refuses in one line; ' +
    'the first keeps serving',
  async t => {
    const dir = await dataDir()
    const metricsPort = String(await freePort())
    const first = await startServer(t, { DATA_DIR: dir, METRICS_PORT: metricsPort })
    const key = await keyOf(dir)
    const started = Date.now()
    const second = await startServer(t, { DATA_DIR: dir, METRICS_PORT: metricsPort }, { listening: false })
    t.equal(await second.exited, 1, 'the second exits with 1')
    t.ok(Date.now() - started < 15000, `within seconds (${Date.now() - started} ms)`)
    const refusal = second
      .output()
      .split('\n')
      .filter(line => line.startsWith('petstore:'))
    t.equal(refusal.length, 1, `one line: ${second.output()}`)
    t.match(
      refusal[0],
      `DATA_DIR ${dir} is in use by another petstore process (pid ${first.child.pid}, http://127.0.0.1:${first.port})`
    )
    t.ok(stackFree(second.output()), 'no stack trace')
    t.notMatch(second.output(), /9464|METRICS_PORT/, 'not a metrics-port failure')

    t.equal((await categoriesRequest(first, key)).status, 200, 'the first still answers')
    t.equal((await fetch(`http://127.0.0.1:${first.port}/health/ready`)).status, 200, 'and is still ready')
    t.equal((await lockOf(dir)).pid, first.child.pid, 'the lock still names the first')
    first.child.kill('SIGTERM')
    t.equal(await first.exited, 0)
  }
)

t.test(
  'a postgres left by a SIGKILLed start is an orphan: the next start stops it and serves the same data',
  async t => {
    const dir = await dataDir()
    const first = await startServer(t, { DATA_DIR: dir })
    const key = await keyOf(dir)
    t.equal((await categoriesRequest(first, key, 'POST', { name: 'kept' })).status, 201)
    const { postgresPid } = await lockOf(dir)
    first.child.kill('SIGKILL')
    await first.exited
    t.ok(isAlive(postgresPid), `its postgres (pid ${postgresPid}) outlived it`)

    const second = await startServer(t, { DATA_DIR: dir })
    t.notOk(isAlive(postgresPid), 'the orphan was stopped')
    const list = await categoriesRequest(second, key)
    t.same(
      (list.body as Array<{ name: string }>).map(c => c.name),
      ['kept'],
      'the data is intact'
    )
    second.child.kill('SIGTERM')
    t.equal(await second.exited, 0)
  }
)

/** The pids of initdb processes building a cluster under `dir` (Linux /proc). */
async function initdbsUnder (dir: string): Promise<number[]> {
  const pids = []
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    const args = (await readFile(`/proc/${entry}/cmdline`, 'utf8').catch(() => '')).split('\0')
    if (path.basename(args[0] ?? '') === 'initdb' && args.some(a => a.startsWith(`--pgdata=${dir}/`))) {
      pids.push(Number(entry))
    }
  }
  return pids
}

/**
 * A start SIGKILLed as soon as initdb's bootstrap writes the cluster, so that initdb,
 * orphaned, has seconds of work left; then the next start on the same directory.
 * With `collide`, the orphan is paused until the next start's own initdb runs, so
 * that the two overlap every time (free-running, they overlapped in about half the rounds).
 */
async function startAfterOrphanedInitdb (
  t: Test,
  dir: string,
  collide: boolean
): Promise<{ second: ServerProcess; orphans: number[] }> {
  const first = await startServer(t, { DATA_DIR: dir }, { listening: false })
  const bootstrapping = async (): Promise<boolean> =>
    (await readdir(dir)).some(name => name.startsWith('postgres.initdb') && existsSync(path.join(dir, name, 'base')))
  await until('initdb is bootstrapping', bootstrapping, 60000, 5)
  first.child.kill('SIGKILL')
  await first.exited
  const orphans = await initdbsUnder(dir)
  t.teardown(async () => {
    // Only an orphan still building under `dir`: by now its pid may be another process's (pids come round).
    for (const pid of await initdbsUnder(dir)) if (orphans.includes(pid)) process.kill(pid, 'SIGKILL')
  })
  t.ok(orphans.length > 0, 'initdb outlived the start killed mid-bootstrap')
  if (collide) for (const pid of orphans) process.kill(pid, 'SIGSTOP')
  const second = await startServer(t, { DATA_DIR: dir }, { listening: false })
  if (collide) {
    const running = async (): Promise<boolean> => (await initdbsUnder(dir)).some(pid => !orphans.includes(pid))
    await t.resolves(until("the next start's initdb runs", running, 60000, 10),
      "the next start's initdb ran while the orphan was paused")
    for (const pid of orphans) process.kill(pid, 'SIGCONT')
  }
  return { second, orphans }
}

t.test("an initdb left running by a SIGKILLed start cannot spoil the next start's cluster", async t => {
  // Free-running rounds exercise the other overlap: the orphan still writing while the next start removes its
  // directory.
  for (const [round, collide] of [
    [1, true],
    [2, false],
    [3, false]
  ] as const) {
    const dir = await dataDir()
    const { second, orphans } = await startAfterOrphanedInitdb(t, dir, collide)
    t.ok(
      await second.waitFor('Server listening', 60000),
      `round ${round}: the next start serves: ${second
        .output()
        .split('\n')
        .filter(line => line.startsWith('petstore:'))
        .join(' / ')}`
    )
    const key = await keyOf(dir)
    t.equal((await categoriesRequest(second, key, 'POST', { name: 'kept' })).status, 201, `round ${round}: and writes`)
    second.child.kill('SIGTERM')
    t.equal(await second.exited, 0)

    // Once the orphan is gone, a start clears what it left beside the cluster.
    await until('the orphans are gone', async () => !orphans.some(isAlive), 60000, 50)
    const third = await startServer(t, { DATA_DIR: dir })
    t.same(
      (await categoriesRequest(third, key)).body,
      [{ id: 1, name: 'kept' }],
      `round ${round}: the cluster is intact`
    )
    t.same(
      (await readdir(dir)).filter(name => name.startsWith('postgres.initdb')),
      [],
      `round ${round}: no initdb directory is left`
    )
    third.child.kill('SIGTERM')
    t.equal(await third.exited, 0)
  }
})

t.test('a postgres that no petstore lock names is not ours to stop: the start refuses, naming its pid', async t => {
  const dir = await dataDir()
  const first = await startServer(t, { DATA_DIR: dir })
  const { postgresPid } = await lockOf(dir)
  first.child.kill('SIGKILL')
  await first.exited
  t.teardown(async () => {
    if (!isAlive(postgresPid)) return
    process.kill(postgresPid, 'SIGINT')
    await until('the orphaned PostgreSQL stopped', async () => !isAlive(postgresPid), 60000, 100)
  })
  await rm(path.join(dir, 'petstore.lock'))

  const second = await startServer(t, { DATA_DIR: dir }, { listening: false })
  t.equal(await second.exited, 1)
  t.match(
    second.output(),
    new RegExp(
      `petstore: an embedded PostgreSQL \\(pid ${postgresPid}\\) already runs on ${dir}/postgres ` +
        `and no petstore process owns it; stop it \\(kill ${postgresPid}\\)`
    )
  )
  t.ok(stackFree(second.output()), 'no stack trace')
  t.ok(isAlive(postgresPid), 'it was left running')
})

t.test('the lock: refused while its owner lives, taken over once it is gone or its pid was reused', async t => {
  const dir = await dataDir()
  const lock = await lockDataDir(dir, 'http://127.0.0.1:1')
  await t.rejects(lockDataDir(dir), {
    name: 'EmbeddedPostgresError',
    message: `DATA_DIR ${dir} is in use by another petstore process (pid ${process.pid}, http://127.0.0.1:1)`
  })
  await lock.release()
  const again = await lockDataDir(dir)
  t.equal(again.previous, undefined, 'a released lock leaves nothing behind')
  await again.release()

  // pid 1 is alive, but was not started when this lock says: the pid was reused after the owner died.
  await writeFile(
    path.join(dir, 'petstore.lock'),
    JSON.stringify({ pid: 1, startTime: 'long ago', postgresPid: 12345 })
  )
  const afterReuse = await lockDataDir(dir)
  t.same(
    afterReuse.previous,
    { pid: 1, startTime: 'long ago', postgresPid: 12345 },
    'the stale owner is reported, for the orphan check'
  )
  await afterReuse.release()

  await writeFile(path.join(dir, 'petstore.lock'), 'not json')
  const afterGarbage = await lockDataDir(dir)
  t.equal(afterGarbage.previous, undefined, 'an unreadable lock names no owner')
  await afterGarbage.release()
})

t.test('the lock is never seen half-written: a start reading it while its owner records more is refused', async t => {
  const dir = await dataDir()
  const lock = await lockDataDir(dir, 'http://127.0.0.1:1')
  t.teardown(lock.release)
  const done = new AbortController()
  const records = (async () => {
    for (let i = 0; !done.signal.aborted; i++) await lock.record({ postgresPort: i })
  })()
  const outcomes: string[] = []
  for (let i = 0; i < LOCK_READS; i++) {
    const outcome = await lockDataDir(dir).then(() => 'taken', (err: Error) => err.message)
    outcomes.push(outcome)
    if (outcome === 'taken') break
  }
  done.abort()
  await records
  t.same(outcomes.filter(o => !o.includes('is in use by another petstore process')), [], 'every read was refused')
})
