import { execFile } from 'node:child_process'
import { cp, mkdir, mkdtemp, rm, symlink } from 'node:fs/promises'
import path from 'node:path'
import { promisify } from 'node:util'
import { untracked } from './untracked.js'

/*
 * The service built as `npm start` builds it, once per test run: scripts/run-tests.ts builds a
 * copy of this checkout before tap starts and names it in BUILT_CHECKOUT_VARIABLE, so that every
 * file runs the same dist/ (the working tree's own dist/ may be stale or absent). A file run with
 * `npx tap` alone builds a copy of its own.
 */

export const BUILT_CHECKOUT_VARIABLE = 'TEST_BUILT_CHECKOUT'

const REPO = process.cwd()
/** What a build reads (a copy of the checkout holds these); node_modules and migrations are linked, not copied. */
export const BUILD_SOURCES = ['src', 'clients', 'packages', 'package.json', 'tsconfig.json', 'tsconfig.build.json']
const LINKED = ['node_modules', 'migrations']

const run = promisify(execFile)

/** Copies the checkout into a new directory under .cache/ and builds it there; returns the directory. */
export async function buildCheckout (): Promise<string> {
  await mkdir(path.join(REPO, '.cache'), { recursive: true })
  const copy = await mkdtemp(path.join(REPO, '.cache', 'built-'))
  for (const entry of BUILD_SOURCES) await cp(path.join(REPO, entry), path.join(copy, entry), { recursive: true })
  for (const entry of LINKED) await symlink(path.join(REPO, entry), path.join(copy, entry))
  await run(...untracked('npm', ['run', 'build', '--silent']), { cwd: copy })
  return copy
}

interface Teardown { teardown: (fn: () => Promise<void> | void) => void }

let ownBuild: Promise<string> | undefined

/** The run's built checkout, or (outside `npm test`) one built for this file and removed after it. */
export async function builtCheckout (t: Teardown): Promise<string> {
  const shared = process.env[BUILT_CHECKOUT_VARIABLE]
  if (shared !== undefined) return shared
  if (ownBuild === undefined) {
    const building = buildCheckout()
    ownBuild = building
    t.teardown(async () => { await rm(await building, { recursive: true, force: true }) })
  }
  return await ownBuild
}
