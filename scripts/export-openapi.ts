import { mkdir, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { servedOpenApi } from './served-openapi.js'

/**
 * Writes the OpenAPI document exactly as GET /docs/openapi.json serves it, for the linter.
 * Usage: node --import tsx scripts/export-openapi.ts <output-file>
 */
const output = process.argv[2] ?? 'openapi.json'
const document = await servedOpenApi()
await mkdir(path.dirname(path.resolve(output)), { recursive: true })
await writeFile(output, document)
