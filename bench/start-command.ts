import { readFileSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const ROOT = fileURLToPath(new URL('..', import.meta.url))

/** The node flags in a start script of the form `node <flags> dist/server.js`. */
export function nodeFlagsOf (start: string): string[] {
  const words = start.trim().split(/\s+/)
  const shaped = words[0] === 'node' && words[words.length - 1] === 'dist/server.js'
  if (!shaped) throw new Error(`package.json start is not "node <flags> dist/server.js": ${start}`)
  return words.slice(1, -1)
}

/** The node flags `npm start` runs the service with: the benchmark runs what production runs. */
export function serviceNodeFlags (): string[] {
  const manifest = JSON.parse(readFileSync(path.join(ROOT, 'package.json'), 'utf8')) as { scripts: { start: string } }
  return nodeFlagsOf(manifest.scripts.start)
}

/** npm start's flags, then BENCH_SERVICE_NODE_ARGS (for looking inside; never for published results). */
export function benchServiceNodeArgs (extra = process.env.BENCH_SERVICE_NODE_ARGS ?? ''): string[] {
  return [...serviceNodeFlags(), ...extra.split(/\s+/).filter(arg => arg !== '')]
}
