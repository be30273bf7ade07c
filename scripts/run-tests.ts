import { spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import path from 'node:path'
import { constants } from 'node:os'
import { SERVER_SOURCE_VARIABLE, SERVER_URL_VARIABLE } from '../test/helpers/database.js'
import { chooseSource, describeChoice, startPostgresServer, type PostgresServer } from '../test/helpers/postgres-server.js'

/**
 * `npm test`: one PostgreSQL server for the whole run (each test file makes its own
 * database on it), then tap with the arguments given, then the server is stopped,
 * whatever happened. Prints once which server and why (test/helpers/postgres-server.ts).
 * Usage: node --import tsx scripts/run-tests.ts [tap arguments]
 */
const require = createRequire(import.meta.url)
const tapPackage = require.resolve('tap/package.json')
const tapBin = path.join(path.dirname(tapPackage), (JSON.parse(readFileSync(tapPackage, 'utf8')) as { bin: { tap: string } }).bin.tap)

let signalled: NodeJS.Signals | undefined
let tap: ReturnType<typeof spawn> | undefined
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
  // Let tap finish its own teardown; the server is stopped once it has exited.
  process.on(signal, () => { signalled = signal; tap?.kill(signal) })
}

function exitCodeFor (signal: NodeJS.Signals): number {
  return 128 + (constants.signals[signal] ?? 1)
}

function errorChain (err: unknown): string {
  const lines: string[] = []
  for (let e: unknown = err; e !== undefined && lines.length < 4; e = (e as { cause?: unknown }).cause) {
    const message = e instanceof Error ? e.message : String(e)
    if (!lines.some(line => line.includes(message))) lines.push(message)
  }
  return lines.join('\n  caused by: ')
}

let server: PostgresServer
const started = Date.now()
try {
  const choice = await chooseSource()
  console.log(`test database: ${describeChoice(choice)}`)
  server = await startPostgresServer(choice)
} catch (err) {
  console.error(`test database: could not start: ${errorChain(err)}`)
  process.exit(1)
}
console.log(`test database: ${server.source} server ready after ${((Date.now() - started) / 1000).toFixed(1)} s; one database per test file`)

let exitCode = 1
if (signalled === undefined) {
  tap = spawn(process.execPath, [tapBin, ...process.argv.slice(2)], {
    stdio: 'inherit',
    env: { ...process.env, [SERVER_URL_VARIABLE]: server.url, [SERVER_SOURCE_VARIABLE]: server.source }
  })
  exitCode = await new Promise<number>(resolve => {
    tap?.on('exit', (code, signal) => { resolve(code ?? exitCodeFor(signal ?? 'SIGTERM')) })
    tap?.on('error', err => { console.error(`could not run tap: ${err.message}`); resolve(1) })
  })
} else {
  exitCode = exitCodeFor(signalled)
}
try {
  await server.stop()
} catch (err) {
  console.error(`test database: could not stop the ${server.source} server: ${errorChain(err)}`)
  exitCode ||= 1
}
process.exit(exitCode)
