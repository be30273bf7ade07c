import { existsSync } from 'node:fs'
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import t, { type Test } from 'tap'
import { startServer } from './helpers/server-process.js'
import { until } from './helpers/until.js'

/*
 * The embedded database's password and the development key are secrets: never in
 * a file another user can read, whether the start succeeds, fails or is killed.
 * Each start gets its own TMPDIR (as world-writable as /tmp) to look into afterwards.
 */

t.setTimeout(240000)

/** How long a start may take to reach initdb on a loaded machine. */
const INITDB_STARTS_MS = 30_000

async function scratch (prefix: string): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), prefix))
  t.teardown(async () => {
    await rm(dir, { recursive: true, force: true })
  })
  return dir
}

async function files (dir: string): Promise<string[]> {
  const entries = await readdir(dir, { recursive: true, withFileTypes: true }).catch(() => [])
  return entries.filter(e => e.isFile()).map(e => path.join(e.parentPath, e.name))
}

/** Every file under `dir` that holds `secret`, with its mode. */
async function holding (dir: string, secret: string): Promise<Array<{ file: string; mode: string }>> {
  const found = []
  for (const file of await files(dir)) {
    const content = await readFile(file, 'utf8').catch(() => '')
    if (content.includes(secret)) {
      found.push({ file: path.relative(dir, file), mode: ((await stat(file)).mode & 0o777).toString(8) })
    }
  }
  return found
}

/** Where the cluster and initdb's password file live: DATA_DIR, or (root, unreachable DATA_DIR) the place it records.
 * */
async function clusterParent (data: string): Promise<string> {
  const location = await readFile(path.join(data, 'postgres-location'), 'utf8').catch(() => undefined)
  return location === undefined ? data : path.dirname(location.trim())
}

async function expectNoReadableSecret (t: Test, tmp: string, data: string): Promise<void> {
  t.same(
    (await files(tmp)).filter(f => path.basename(f).startsWith('pg-password')),
    [],
    'no pg-password file under TMPDIR'
  )
  // The superuser's, and the service role's.
  for (const name of ['postgres-password', 'petstore-password']) {
    const password = (await readFile(path.join(data, name), 'utf8')).trim()
    t.same(await holding(tmp, password), [], `${name}: in no file under TMPDIR`)
    const parent = await clusterParent(data)
    const kept = [...(await holding(data, password)), ...(parent === data ? [] : await holding(parent, password))]
    t.ok(kept.length > 0, `${name}: kept in DATA_DIR`)
    t.same(
      kept.filter(f => f.mode !== '600'),
      [],
      `${name}: every file holding it is 0600 (${kept.map(f => `${f.file} ${f.mode}`).join(', ')})`
    )
  }
}

t.test('a start SIGKILLed while initdb runs leaves no readable secret, and the next start recovers', async t => {
  const tmp = await scratch('petstore-tmpdir-')
  await chmod(tmp, 0o1777)
  const data = await scratch('petstore-secrets-')
  const env = { DATA_DIR: data, TMPDIR: tmp }
  const killed = await startServer(t, env, { listening: false })
  // Kill it while initdb runs, its password file written (initdb's own directory beside the cluster, or ./postgres,
  // exists).
  await until('initdb runs', async () =>
    (await readdir(await clusterParent(data)).catch(() => [])).some(name => name.startsWith('postgres.initdb-')) ||
    existsSync(path.join(data, 'postgres')), INITDB_STARTS_MS)
  killed.child.kill('SIGKILL')
  await killed.exited
  await expectNoReadableSecret(t, tmp, data)

  const next = await startServer(t, env)
  const key = (await readFile(path.join(data, 'dev-api-key'), 'utf8')).trim()
  t.equal(
    (await fetch(`http://127.0.0.1:${next.port}/v1/categories`, { headers: { authorization: `Bearer ${key}` } }))
      .status,
    200,
    'the next start serves'
  )
  next.child.kill('SIGTERM')
  t.equal(await next.exited, 0)
  await expectNoReadableSecret(t, tmp, data)
  t.same(await holding(data, key), [{ file: 'dev-api-key', mode: '600' }], 'the development key is kept once, 0600')
})

t.test('a start that fails (a broken cluster) says why in one line and leaves no readable secret', async t => {
  const tmp = await scratch('petstore-tmpdir-')
  await chmod(tmp, 0o1777)
  const data = await scratch('petstore-secrets-')
  await mkdir(path.join(data, 'postgres'), { recursive: true, mode: 0o700 })
  await writeFile(path.join(data, 'postgres', 'PG_VERSION'), '7\n')
  const failed = await startServer(t, { DATA_DIR: data, TMPDIR: tmp }, { listening: false })
  t.equal(await failed.exited, 1)
  t.match(
    failed.output(),
    /^petstore: the embedded PostgreSQL did not start \(cluster .*\): .*; fix that, or set DATABASE_URL/m
  )
  t.notMatch(failed.output(), /\n\s+at .+:\d+/, 'no stack trace')
  t.notOk(existsSync(path.join(data, 'petstore.lock')), 'the lock was released')
  await expectNoReadableSecret(t, tmp, data)
})
