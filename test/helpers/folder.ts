import { readdir } from 'node:fs/promises'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import t from 'tap'

/*
 * Every *.test.ts file of a folder, run in this one test process. Each test process pays about 5 CPU s before its
 * first test (tap's three module loaders, the 373 modules of TypeBox, the app): a folder of small files pays it
 * once. Each file still makes its own database and apps, as it does run alone (`npm test -- test/http/cors.test.ts`),
 * and what it tears down at its top level is torn down when the process ends.
 */
export async function runFolder (folder: URL): Promise<void> {
  const files = (await readdir(folder)).filter(name => name.endsWith('.test.ts')).sort()
  // Files are loaded inside a test: once a file has registered a top-level teardown, tap ends the process's tests
  // as soon as none is queued, which would be while the next file loads. Their tests run after this one.
  await t.test(`the test files of ${path.relative('.', fileURLToPath(folder))}/ load`, async t => {
    for (const file of files) await import(new URL(file, folder).href)
    t.pass(`${files.length} files`)
  })
}
