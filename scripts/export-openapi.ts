import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { buildApp } from '../src/app.js'
import { loadConfig } from '../src/config.js'
import { startEmbeddedPostgres } from '../src/db/embedded.js'

/**
 * Writes the OpenAPI document exactly as GET /docs/openapi.json serves it, for the
 * linter. Builds the real app (on DATABASE_URL, else a throwaway embedded database).
 * Usage: node --import tsx scripts/export-openapi.ts <output-file>
 */
const output = process.argv[2] ?? 'openapi.json'
const config = loadConfig({ ...process.env, API_KEYS: 'openapi-export', LOG_LEVEL: 'warn', METRICS_PORT: '0' })
const dir = config.databaseUrl === undefined ? await mkdtemp(path.join(tmpdir(), 'petstore-openapi-')) : undefined
const embedded = dir === undefined ? undefined : await startEmbeddedPostgres({ dir })
try {
  const app = await buildApp({ ...config, databaseUrl: config.databaseUrl ?? embedded?.url ?? '' })
  const res = await app.inject({ method: 'GET', url: '/docs/openapi.json' })
  await mkdir(path.dirname(path.resolve(output)), { recursive: true })
  await writeFile(output, res.body)
  await app.close()
} finally {
  await embedded?.destroy()
  if (dir !== undefined) await rm(dir, { recursive: true, force: true })
}
