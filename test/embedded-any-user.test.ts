import { execFileSync } from 'node:child_process'
import { chmod, chown, cp, mkdir, mkdtemp, readFile, rm, stat } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import t from 'tap'
import { isAlive, ROOT_STATE_DIR } from '@petstore/embedded-postgres'
import { builtCheckout } from './helpers/built-checkout.js'
import { startServer } from './helpers/server-process.js'

/*
 * `npm start` with no configuration, in a checkout under a directory only its
 * owner can enter (mktemp -d, /root/...): as root, PostgreSQL runs as the
 * `postgres` user, which can reach neither node_modules nor ./data there.
 */

t.setTimeout(240000)
const asRoot = process.getuid?.() === 0
const repo = process.cwd()

/**
 * A checkout in a fresh 0700 directory: the run's build (what `npm start` runs once it has built), the
 * migrations, node_modules hard-linked (copied when the temporary directory is on another file system).
 * Under the system's temporary directory, not this repository: the repository may itself be in a
 * directory only its owner can enter (a clone under /root), which another user could then never reach.
 */
async function privateCheckout (owner?: { uid: number; gid: number }): Promise<string> {
  const outer = await mkdtemp(path.join(tmpdir(), 'petstore-private-'))
  t.teardown(async () => {
    await rm(outer, { recursive: true, force: true })
  })
  const app = path.join(outer, 'app')
  await mkdir(app)
  const built = await builtCheckout(t)
  for (const entry of ['dist', 'packages', 'package.json']) {
    await cp(path.join(built, entry), path.join(app, entry), { recursive: true })
  }
  await cp(path.join(repo, 'migrations'), path.join(app, 'migrations'), { recursive: true })
  const sameFileSystem = (await stat(repo)).dev === (await stat(outer)).dev
  execFileSync('cp', [sameFileSystem ? '-al' : '-a', path.join(repo, 'node_modules'), path.join(app, 'node_modules')])
  if (owner !== undefined) {
    // The hard links share their inodes with the repository's: only the directories are given to the user.
    await chown(outer, owner.uid, owner.gid)
    await chown(app, owner.uid, owner.gid)
  }
  await chmod(outer, 0o700)
  return app
}

async function getWithKey (port: number, key: string): Promise<number> {
  const res = await fetch(`http://127.0.0.1:${port}/v1/categories`, { headers: { authorization: `Bearer ${key}` } })
  return res.status
}

t.test(
  'as root in a 0700 directory: npm start starts the embedded PostgreSQL, serves, and stops it',
  { skip: asRoot ? false : 'runs only as root' },
  async t => {
    const app = await privateCheckout()
    const server = await startServer(t, {}, { cwd: app })
    const location = (await readFile(path.join(app, 'data', 'postgres-location'), 'utf8')).trim()
    t.teardown(async () => {
      await rm(path.dirname(location), { recursive: true, force: true })
    })
    t.ok(
      location.startsWith(`${ROOT_STATE_DIR}/clusters/`),
      `the cluster lives where the postgres user can reach it (${location}), recorded in data/postgres-location`
    )
    const key = (await readFile(path.join(app, 'data', 'dev-api-key'), 'utf8')).trim()
    t.equal(await getWithKey(server.port, key), 200, 'serves with the printed development key')
    const { postgresPid } = JSON.parse(await readFile(path.join(app, 'data', 'petstore.lock'), 'utf8')) as {
      postgresPid: number
    }
    server.child.kill('SIGTERM')
    t.equal(await server.exited, 0)
    t.notOk(isAlive(postgresPid), 'its PostgreSQL stopped with it')
    t.notMatch(server.output(), /EACCES|\n\s+at /, 'no permission error, no stack')

    const again = await startServer(t, {}, { cwd: app })
    t.equal(await getWithKey(again.port, key), 200, 'a restart finds the same cluster and key')
    again.child.kill('SIGTERM')
    t.equal(await again.exited, 0)
  }
)

t.test(
  'as another user (nobody) in its own 0700 directory: the same',
  { skip: asRoot ? false : 'needs root to switch users' },
  async t => {
    const nobody = {
      uid: Number(execFileSync('id', ['-u', 'nobody']).toString()),
      gid: Number(execFileSync('id', ['-g', 'nobody']).toString())
    }
    const app = await privateCheckout(nobody)
    const server = await startServer(t, { HOME: app }, { cwd: app, user: nobody })
    const key = (await readFile(path.join(app, 'data', 'dev-api-key'), 'utf8')).trim()
    t.equal(await getWithKey(server.port, key), 200)
    t.ok(
      (await readFile(path.join(app, 'data', 'postgres', 'PG_VERSION'), 'utf8')).length > 0,
      'the cluster is in ./data'
    )
    server.child.kill('SIGTERM')
    t.equal(await server.exited, 0)
  }
)
