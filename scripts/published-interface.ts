import { execFileSync } from 'node:child_process'
import { readFile, writeFile } from 'node:fs/promises'
import { buildApp } from '../src/app.js'
import { loadConfig } from '../src/config.js'
import { compareDocuments } from './api-compatibility.js'
import { clientOperations, clientTypes } from './generate-client.js'
import { generateCollection } from './generate-postman.js'

/*
 * The published interface as files in the repository, all generated from the document the service serves.
 * scripts/api-files.ts is the command line. The base `check` compares with is the `base` file, else openapi.json
 * at the merge base with main (origin/main), else at HEAD^ (on main itself).
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
  if (file !== undefined) return { text: await readFile(file, 'utf8'), from: file }
  const head = git(['rev-parse', 'HEAD'])
  if (head === undefined) return undefined
  const mergeBase = ['origin/main', 'main']
    .map(ref => git(['merge-base', 'HEAD', ref]))
    .find(found => found !== undefined && found !== head)
  const ref = mergeBase ?? 'HEAD^'
  const text = git(['show', `${ref}:${DOCUMENT}`])
  return text === undefined ? undefined : { text, from: `${DOCUMENT} at ${ref}` }
}

/** Writes every artifact from the document the service serves. */
export async function generate (): Promise<string[]> {
  const document = await servedOpenApi()
  for (const [file, make] of Object.entries(ARTIFACTS)) await writeFile(file, await make(document))
  return Object.keys(ARTIFACTS)
}

/**
 * Stale files (only without `document`) and breaking changes against the base. With `document`, that file stands
 * for the served document and only the breaking-change check runs. Errors fail CI; notes are information.
 */
export async function check (
  options: { base?: string; document?: string }
): Promise<{ errors: string[]; notes: string[] }> {
  const errors: string[] = []
  const notes: string[] = []
  let current: string
  if (options.document !== undefined) {
    current = await readFile(options.document, 'utf8')
  } else {
    current = await servedOpenApi()
    for (const [file, make] of Object.entries(ARTIFACTS)) {
      if ((await readFile(file, 'utf8').catch(() => '')) === (await make(current))) continue
      errors.push(
        `error: ${file} is stale against the document the service serves: run npm run api:generate and commit it`
      )
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
    for (const change of breaking) errors.push(`error: breaking change against ${base.from}: ${change}`)
    notes.push(`compared with ${base.from}: ${breaking.length} breaking, ${warnings.length} allowed`)
  }
  return { errors, notes }
}
