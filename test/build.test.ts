import { execFile } from 'node:child_process'
import { appendFile, cp, mkdir, mkdtemp, rm, stat, symlink } from 'node:fs/promises'
import path from 'node:path'
import { promisify } from 'node:util'
import t from 'tap'

/*
 * `npm start` builds first (prestart). With nothing changed since the last build,
 * that step must not compile again: it only checks, and leaves dist/ as it is.
 */

t.setTimeout(240000)
const run = promisify(execFile)
const repo = process.cwd()

t.test('the build compiles once, leaves an up-to-date dist/ untouched, and compiles again after a change', async t => {
  await mkdir(path.join(repo, '.cache'), { recursive: true })
  const copy = await mkdtemp(path.join(repo, '.cache', 'build-'))
  t.teardown(async () => { await rm(copy, { recursive: true, force: true }) })
  for (const entry of ['src', 'clients', 'packages', 'package.json', 'tsconfig.json', 'tsconfig.build.json']) await cp(path.join(repo, entry), path.join(copy, entry), { recursive: true })
  await symlink(path.join(repo, 'node_modules'), path.join(copy, 'node_modules'))
  const build = async (): Promise<void> => { await run('npm', ['run', 'build', '--silent'], { cwd: copy }) }
  const builtAt = async (): Promise<number> => (await stat(path.join(copy, 'dist', 'server.js'))).mtimeMs

  await build()
  const first = await builtAt()
  await build()
  t.equal(await builtAt(), first, 'nothing changed: dist/server.js was not written again')

  await appendFile(path.join(copy, 'src', 'server.ts'), '\n// changed\n')
  await build()
  t.not(await builtAt(), first, 'a changed source is compiled')
})
