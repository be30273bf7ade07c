import { execFileSync } from 'node:child_process'
import { readFile, writeFile } from 'node:fs/promises'
import { buildApp } from '../src/app.js'
import { loadConfig } from '../src/config.js'
import { compareDocuments } from './api-compatibility.js'
import { clientOperations, clientTypes } from './generate-client.js'
import { generateCollection } from './generate-postman.js'

/*
 * The published interface as files in the repository, all generated from the document the service
 * serves: openapi.json itself, the TypeScript client's types and methods, and the Postman collection
 * served beside the document. `generate` writes them (npm run api:generate); `check` fails when one
 * is stale, or when the served document breaks a stable operation of the base document (npm run
 * api:check; scripts/api-files.ts is the command line).
 *
 * The base is the `base` file, else the file named by API_BASE, else openapi.json as
 * committed at API_BASE_REF, else at the merge base with main (origin/main), else at
 * HEAD^ (on main itself).
 */

export const DOCUMENT = 'openapi.json'

/**
 * The document exactly as GET /docs/openapi.json serves it (its bytes), from the real app without a database:
 * nothing connects before a request (the change feed's attempts at an address where nothing listens fail quietly).
 */
export async function servedOpenApi (): Promise<string> {
  const NO_DATABASE = 'postgres://openapi-export@127.0.0.1:1/none'
  const { DATABASE_DIRECT_URL: _direct, ...env } = process.env
  const config = loadConfig({
    ...env,
    DATABASE_URL: NO_DATABASE,
    API_KEYS: 'openapi-export',
    LOG_LEVEL: 'silent',
    METRICS_PORT: '0'
  })
  const app = await buildApp({ ...config, databaseUrl: NO_DATABASE })
  try {
    const res = await app.inject({ method: 'GET', url: '/docs/openapi.json' })
    if (res.statusCode !== 200) throw new Error(`GET /docs/openapi.json answered ${res.statusCode}: ${res.body}`)
    return res.body
  } finally {
    await app.close()
  }
}

/** Every file generated from the document, and how. */
export const ARTIFACTS: Record<string, (document: string) => string | Promise<string>> = {
  [DOCUMENT]: document => document,
  'clients/typescript/src/generated/openapi.ts': clientTypes,
  'clients/typescript/src/generated/operations.ts': clientOperations,
  'src/http/petstore.postman_collection.json': generateCollection
}

function git (args: string[]): string | undefined {
  try {
    return execFileSync('git', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim()
  } catch {
    return undefined
  }
}

/** The published document to compare with, and where it came from; undefined when there is none yet. */
async function baseDocument (file: string | undefined): Promise<{ text: string; from: string } | undefined> {
  const named = file ?? process.env.API_BASE
  if (named !== undefined && named !== '') return { text: await readFile(named, 'utf8'), from: named }
  const head = git(['rev-parse', 'HEAD'])
  if (head === undefined) return undefined
  const mergeBase = ['origin/main', 'main']
    .map(ref => git(['merge-base', 'HEAD', ref]))
    .find(found => found !== undefined && found !== head)
  const ref = process.env.API_BASE_REF ?? mergeBase ?? 'HEAD^'
  const text = git(['show', `${ref}:${DOCUMENT}`])
  return text === undefined ? undefined : { text, from: `${DOCUMENT} at ${ref}` }
}

async function readOrEmpty (file: string): Promise<string> {
  return await readFile(file, 'utf8').catch(() => '')
}

/** Writes every artifact from the document the service serves. */
export async function generate (): Promise<string[]> {
  const document = await servedOpenApi()
  for (const [file, make] of Object.entries(ARTIFACTS)) await writeFile(file, await make(document))
  return Object.keys(ARTIFACTS)
}

/** What `check` found: errors fail CI; notes (allowed changes, where the base came from) are information. */
export interface CheckResult {
  errors: string[]
  notes: string[]
}

/**
 * Stale files (only without `document`) and breaking changes against the base. With `document`,
 * that file stands for the served document and only the breaking-change check runs.
 */
export async function check (options: { base?: string; document?: string }): Promise<CheckResult> {
  const problems: string[] = []
  const notes: string[] = []
  let current: string
  if (options.document !== undefined) {
    current = await readFile(options.document, 'utf8')
  } else {
    current = await servedOpenApi()
    for (const [file, make] of Object.entries(ARTIFACTS)) {
      if ((await readOrEmpty(file)) === (await make(current))) continue
      problems.push(`${file} is stale against the document the service serves: run npm run api:generate and commit it`)
    }
  }
  const base = await baseDocument(options.base)
  if (base === undefined) {
    notes.push(
      `no published ${DOCUMENT} to compare with (none at the merge base or HEAD^): breaking-change check skipped`
    )
  } else {
    const { breaking, warnings } = compareDocuments(JSON.parse(base.text), JSON.parse(current))
    for (const warning of warnings) notes.push(`warning: ${warning}`)
    for (const change of breaking) problems.push(`breaking change against ${base.from}: ${change}`)
    notes.push(`compared with ${base.from}: ${breaking.length} breaking, ${warnings.length} allowed`)
  }
  return { errors: problems.map(problem => `error: ${problem}`), notes }
}
