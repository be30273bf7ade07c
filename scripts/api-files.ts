import { execFileSync } from 'node:child_process'
import { readFile, writeFile } from 'node:fs/promises'
import { parseArgs } from 'node:util'
import { compareDocuments } from './api-compatibility.js'
import { clientTypes } from './client-types.js'
import { servedOpenApi } from './served-openapi.js'

/*
 * The published interface as files in the repository: openapi.json (the document
 * exactly as served) and the TypeScript client's types generated from it.
 *
 *   generate                 writes both (npm run api:generate)
 *   check                    fails when either is stale, or when the served document breaks a
 *                            stable operation of the base document (npm run api:check)
 *   check --base F --document G   only the breaking-change check, between two files
 *
 * The base is --base, else the file named by API_BASE, else openapi.json as committed at
 * API_BASE_REF, else at the merge base with main (origin/main), else at HEAD^ (on main itself).
 */

import { CLIENT_TYPES, DOCUMENT } from './client-types.js'

function git (args: string[]): string | undefined {
  try {
    return execFileSync('git', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim()
  } catch {
    return undefined
  }
}

/** The published document to compare with, and where it came from; undefined when there is none yet. */
async function baseDocument (file: string | undefined): Promise<{ text: string, from: string } | undefined> {
  const named = file ?? process.env.API_BASE
  if (named !== undefined && named !== '') return { text: await readFile(named, 'utf8'), from: named }
  const head = git(['rev-parse', 'HEAD'])
  if (head === undefined) return undefined
  const mergeBase = ['origin/main', 'main'].map(ref => git(['merge-base', 'HEAD', ref])).find(found => found !== undefined && found !== head)
  const ref = process.env.API_BASE_REF ?? mergeBase ?? 'HEAD^'
  const text = git(['show', `${ref}:${DOCUMENT}`])
  return text === undefined ? undefined : { text, from: `${DOCUMENT} at ${ref}` }
}

async function readOrEmpty (file: string): Promise<string> {
  return await readFile(file, 'utf8').catch(() => '')
}

async function generate (): Promise<void> {
  const document = await servedOpenApi()
  await writeFile(DOCUMENT, document)
  await writeFile(CLIENT_TYPES, await clientTypes(document))
  console.log(`wrote ${DOCUMENT} and ${CLIENT_TYPES}`)
}

async function check (options: { base?: string, document?: string }): Promise<boolean> {
  const problems: string[] = []
  let current: string
  if (options.document !== undefined) {
    current = await readFile(options.document, 'utf8')
  } else {
    current = await servedOpenApi()
    if (await readOrEmpty(DOCUMENT) !== current) problems.push(`${DOCUMENT} is not the document the service serves: run npm run api:generate and commit it`)
    const committed = await readOrEmpty(DOCUMENT)
    if (await readOrEmpty(CLIENT_TYPES) !== await clientTypes(committed)) problems.push(`${CLIENT_TYPES} is stale against ${DOCUMENT}: run npm run api:generate and commit it`)
  }
  const base = await baseDocument(options.base)
  if (base === undefined) {
    console.log(`no published ${DOCUMENT} to compare with (none at the merge base or HEAD^): breaking-change check skipped`)
  } else {
    const { breaking, warnings } = compareDocuments(JSON.parse(base.text), JSON.parse(current))
    for (const warning of warnings) console.log(`warning: ${warning}`)
    for (const change of breaking) problems.push(`breaking change against ${base.from}: ${change}`)
    console.log(`compared with ${base.from}: ${breaking.length} breaking, ${warnings.length} allowed`)
  }
  for (const problem of problems) console.error(`error: ${problem}`)
  return problems.length === 0
}

const { positionals, values } = parseArgs({ allowPositionals: true, options: { base: { type: 'string' }, document: { type: 'string' } } })
if (positionals[0] === 'generate') {
  await generate()
} else if (positionals[0] === 'check') {
  if (!await check(values)) process.exitCode = 1
} else {
  console.error('usage: api-files.ts generate | check [--base FILE] [--document FILE]')
  process.exitCode = 2
}
