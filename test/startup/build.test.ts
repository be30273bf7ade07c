import { execFile } from 'node:child_process'
import { appendFile, cp, mkdtemp, rm, stat } from 'node:fs/promises'
import path from 'node:path'
import { promisify } from 'node:util'
import t from 'tap'
import { builtCheckout } from '../helpers/built-checkout.js'
import { untracked } from '../helpers/untracked.js'

/*
 * `npm start` builds first (prestart). With nothing changed since the last build,
 * that step must not compile again: it only checks, and leaves dist/ as it is.
 */

const run = promisify(execFile)

t.test('the build leaves an up-to-date dist/ untouched, and compiles again after a change', async t => {
  const built = await builtCheckout(t)
  // A copy of the run's build, times kept, to change without touching what other files run.
  const copy = await mkdtemp(`${built}-build-test-`)
  t.teardown(async () => { await rm(copy, { recursive: true, force: true }) })
  await cp(built, copy, { recursive: true, preserveTimestamps: true, verbatimSymlinks: true })
  const build = async (): Promise<void> => {
    await run(...untracked('npm', ['run', 'build', '--silent']), { cwd: copy })
  }
  const builtAt = async (): Promise<number> => (await stat(path.join(copy, 'dist', 'server.js'))).mtimeMs

  const first = await builtAt()
  await build()
  t.equal(await builtAt(), first, 'nothing changed: dist/server.js was not written again')

  await appendFile(path.join(copy, 'src', 'server.ts'), '\n// changed\n')
  await build()
  t.not(await builtAt(), first, 'a changed source is compiled')
})
