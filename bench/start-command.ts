import { readFileSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = fileURLToPath(new URL('..', import.meta.url))

/**
 * The node flags `npm start` runs the service with: package.json's start script
 * is `node <flags> dist/server.js`, and the benchmark runs what production runs.
 */
export function serviceNodeFlags (): string[] {
  const start = (JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { scripts: { start: string } }).scripts.start
  const words = start.trim().split(/\s+/)
  if (words[0] !== 'node' || words[words.length - 1] !== 'dist/server.js') throw new Error(`package.json start is not "node <flags> dist/server.js": ${start}`)
  return words.slice(1, -1)
}

/** What the bench runs the service with: npm start's flags, then BENCH_SERVICE_NODE_ARGS (for looking inside; never for published results). */
export function benchServiceNodeArgs (): string[] {
  return [...serviceNodeFlags(), ...(process.env.BENCH_SERVICE_NODE_ARGS ?? '').split(/\s+/).filter(arg => arg !== '')]
}
