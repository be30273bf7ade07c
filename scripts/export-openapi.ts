import { mkdir, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { buildApp } from '../src/app.js'
import { loadConfig } from '../src/config.js'

/**
 * Writes the OpenAPI document exactly as GET /docs/openapi.json serves it, for the
 * linter. Builds the real app without a database: the document needs none, and
 * nothing connects before a request (the change feed's attempts at an address
 * where nothing listens fail quietly until the app is closed).
 * Usage: node --import tsx scripts/export-openapi.ts <output-file>
 */
const output = process.argv[2] ?? 'openapi.json'
const NO_DATABASE = 'postgres://openapi-export@127.0.0.1:1/none'
const { DATABASE_DIRECT_URL: _direct, ...env } = process.env
const config = loadConfig({ ...env, DATABASE_URL: NO_DATABASE, API_KEYS: 'openapi-export', LOG_LEVEL: 'silent', METRICS_PORT: '0' })
const app = await buildApp({ ...config, databaseUrl: NO_DATABASE })
try {
  const res = await app.inject({ method: 'GET', url: '/docs/openapi.json' })
  if (res.statusCode !== 200) throw new Error(`GET /docs/openapi.json answered ${res.statusCode}: ${res.body}`)
  await mkdir(path.dirname(path.resolve(output)), { recursive: true })
  await writeFile(output, res.body)
} finally {
  await app.close()
}
