import { mkdir, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { parseArgs } from 'node:util'
import { check, generate, servedOpenApi } from './published-interface.js'

/*
 * The published interface (scripts/published-interface.ts) from the command line: `generate` writes every file
 * generated from the served document (npm run api:generate); `check` fails when one is stale or a stable operation
 * breaks (npm run api:check; with --document, only the breaking-change check between two files); `export FILE`
 * writes the served document for the linter (npm run lint:openapi).
 */
const { positionals, values } = parseArgs({
  allowPositionals: true,
  options: { base: { type: 'string' }, document: { type: 'string' } }
})
const [command, output] = positionals
if (command === 'generate') {
  for (const file of await generate()) console.log(`wrote ${file}`)
} else if (command === 'check') {
  const { errors, notes } = await check(values)
  for (const note of notes) console.log(note)
  for (const error of errors) console.error(error)
  if (errors.length > 0) process.exitCode = 1
} else if (command === 'export' && output !== undefined) {
  await mkdir(path.dirname(path.resolve(output)), { recursive: true })
  await writeFile(output, await servedOpenApi())
} else {
  console.error('usage: api-files.ts generate | check [--base FILE] [--document FILE] | export FILE')
  process.exitCode = 2
}
