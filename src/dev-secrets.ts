import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { mkdir, readFile, writeFile } from 'node:fs/promises'
import path from 'node:path'

/**
 * A secret for development (the API key, the embedded database's password):
 * generated once, kept in `file` (owner-only), the same value on every later start.
 */
export async function readOrCreateSecret (file: string, prefix = ''): Promise<{ value: string, created: boolean }> {
  if (existsSync(file)) return { value: (await readFile(file, 'utf8')).trim(), created: false }
  await mkdir(path.dirname(file), { recursive: true })
  const value = `${prefix}${randomBytes(24).toString('base64url')}`
  await writeFile(file, value + '\n', { mode: 0o600 })
  return { value, created: true }
}
