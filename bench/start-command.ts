import { readFileSync } from 'node:fs'

/** The node flags in a start script of the form `node <flags> dist/server.js`. */
export function nodeFlagsOf (start: string): string[] {
  const words = start.trim().split(/\s+/)
  const shaped = words[0] === 'node' && words[words.length - 1] === 'dist/server.js'
  if (!shaped) throw new Error(`package.json start is not "node <flags> dist/server.js": ${start}`)
  return words.slice(1, -1)
}

/** The node flags `npm start` runs the service with: the benchmark runs what production runs. */
export function serviceNodeFlags (): string[] {
  const manifest = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8'))
  return nodeFlagsOf((manifest as { scripts: { start: string } }).scripts.start)
}
