import { execFile } from 'node:child_process'
import { cp, mkdir, mkdtemp, readFile, readdir, readlink, rm, symlink, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { promisify } from 'node:util'
import t, { type Test } from 'tap'
import { TEST_KEY, listeningApp } from './helpers/app.js'
import { testDatabase } from './helpers/database.js'
import { withClient } from './helpers/pg-client.js'

/*
 * What the documentation tells a newcomer to copy works as written: the README's
 * TypeScript client program, run by the README's own commands in a fresh checkout
 * against a live service.
 */

t.setTimeout(240000)
const run = promisify(execFile)
const repo = process.cwd()
const readme = await readFile('README.md', 'utf8')

/** A README section (`## heading`), up to the next one. */
function readmeSection (heading: string): string {
  const text = readme.split(`\n## ${heading}\n`)[1]?.split('\n## ')[0]
  if (text === undefined) throw new Error(`README.md has no section "## ${heading}"`)
  return text
}

/** The one fenced block of this language in a text. */
function codeBlock (text: string, language: string): string {
  const blocks = [...text.matchAll(new RegExp('```' + language + '\\n([\\s\\S]*?)```', 'g'))].map(m => m[1] as string)
  if (blocks.length !== 1) throw new Error(`expected one \`\`\`${language} block, found ${blocks.length}`)
  return blocks[0] as string
}

/**
 * The checkout's sources with nothing built (dist/ is git-ignored), and node_modules as
 * `npm ci` leaves it: the installed packages, and the workspace links into this copy.
 */
async function freshCheckout (t: Test): Promise<string> {
  await mkdir(path.join(repo, '.cache'), { recursive: true })
  const copy = await mkdtemp(path.join(repo, '.cache', 'fresh-checkout-'))
  t.teardown(async () => { await rm(copy, { recursive: true, force: true }) })
  const unbuilt = (source: string): boolean => !['dist', 'node_modules'].includes(path.basename(source))
  for (const entry of ['src', 'clients', 'package.json', 'tsconfig.json', 'tsconfig.build.json']) {
    await cp(path.join(repo, entry), path.join(copy, entry), { recursive: true, filter: unbuilt })
  }
  const modules = path.join(repo, 'node_modules')
  await mkdir(path.join(copy, 'node_modules', '@petstore'), { recursive: true })
  for (const entry of await readdir(modules)) {
    if (entry !== '@petstore') await symlink(path.join(modules, entry), path.join(copy, 'node_modules', entry))
  }
  for (const name of await readdir(path.join(modules, '@petstore'))) {
    const target = await readlink(path.join(modules, '@petstore', name))
    t.notOk(path.isAbsolute(target), `node_modules/@petstore/${name} is npm's relative workspace link`)
    await symlink(target, path.join(copy, 'node_modules', '@petstore', name))
  }
  return copy
}

t.test('the README\'s TypeScript client program runs as written, by its commands, in a fresh checkout', async t => {
  const db = await testDatabase(t)
  const { port } = await listeningApp(t, db.url)
  const section = readmeSection('Calling the API from TypeScript')
  const commands = codeBlock(section, 'sh')
  const program = codeBlock(section, 'ts')
  const file = /\S+\.ts\b/.exec(commands)?.[0]
  const printed = /# prints: (.+)$/m.exec(commands)?.[1]
  if (file === undefined || printed === undefined) throw new Error('the README\'s commands name no program file, or not what it prints')
  const copy = await freshCheckout(t)
  await writeFile(path.join(copy, file), program)
  // What npm start leaves for the commands: the development key (here, the test service's key).
  await mkdir(path.join(copy, 'data'))
  await writeFile(path.join(copy, 'data', 'dev-api-key'), `${TEST_KEY}\n`)
  const env = { ...process.env, PETSTORE_URL: `http://127.0.0.1:${port}` }
  const lastLine = async (): Promise<string | undefined> => {
    const { stdout } = await run('sh', ['-ec', commands], { cwd: copy, env }).catch((error: { stderr: string }) => {
      throw new Error(`the README's commands failed: ${error.stderr}`)
    })
    return stdout.trim().split('\n').at(-1)
  }
  t.equal(await lastLine(), printed, `the commands print what the README says: ${printed}`)

  await withClient(db.url, async client => { await client.query('SELECT setval(\'categories_id_seq\', 9007199254740992)') })
  t.equal(await lastLine(), printed, 'and past 2^53, where JSON.parse would round the id')

  // A consumer compiling it under strict TypeScript, against the declarations the build wrote.
  const tsc = path.join(repo, 'node_modules', 'typescript', 'bin', 'tsc')
  const options = ['--noEmit', '--strict', '--skipLibCheck', '--target', 'ES2022', '--module', 'NodeNext', '--moduleResolution', 'NodeNext', '--lib', 'ES2023,DOM', '--types', 'node']
  const reported = await run(process.execPath, [tsc, ...options, file], { cwd: copy }).then(() => '', (error: { stdout: string }) => error.stdout)
  t.equal(reported, '', 'tsc --strict reports nothing')
})
