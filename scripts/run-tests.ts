import { spawn } from 'node:child_process'
import { readFileSync } from 'node:fs'
import path from 'node:path'
import { availableParallelism, constants } from 'node:os'
import { rm } from 'node:fs/promises'
import { fileURLToPath } from 'node:url'
import { BUILT_CHECKOUT_VARIABLE, buildCheckout } from '../test/helpers/built-checkout.js'
import { SERVER_SOURCE_VARIABLE, SERVER_URL_VARIABLE } from '../test/helpers/database.js'
import {
  chooseSource,
  describeChoice,
  startPostgresServer,
  type PostgresServer
} from '../test/helpers/postgres-server.js'

/**
 * `npm test`: one PostgreSQL server and one build of the checkout for the whole run (each test file makes its own
 * database on the server), then tap with the arguments given, then both are removed, whatever happened.
 * Usage: node --import tsx scripts/run-tests.ts [tap arguments] [test files]
 * With test files named, coverage is off: its thresholds (package.json's "tap") hold for the whole suite, and a
 * passing file must not end with exit 1.
 */
const tapPackage = fileURLToPath(import.meta.resolve('tap/package.json'))
const tapBin = path.join(
  path.dirname(tapPackage),
  (JSON.parse(readFileSync(tapPackage, 'utf8')) as { bin: { tap: string } }).bin.tap
)

let signalled: NodeJS.Signals | undefined
let tap: ReturnType<typeof spawn> | undefined
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
  // Let tap finish its own teardown; the server is stopped once it has exited.
  process.on(signal, () => {
    signalled = signal
    tap?.kill(signal)
  })
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

/**
 * The whole suite runs two files per core: a file waits for about a third of its time (PostgreSQL, the processes it
 * starts, timers), so one per core left the cores 30 % idle (345 s against 244 s on two cores). A --jobs given wins.
 */
const SUITE_FILES_PER_CORE = 2

const args = process.argv.slice(2)
const namesFiles = args.some(arg => !arg.startsWith('-') && /\.(ts|js|mjs)$/.test(arg))
if (namesFiles) {
  console.log('coverage: off (its thresholds are for the whole suite; `npm test` alone checks them)')
  args.unshift('--disable-coverage')
} else {
  args.unshift(`--jobs=${availableParallelism() * SUITE_FILES_PER_CORE}`)
}

const started = Date.now()
const choice = await chooseSource().catch((err: unknown) => {
  console.error(`test database: ${errorChain(err)}`)
  process.exit(1)
})
console.log(`test database: ${describeChoice(choice)}`)
// The build runs while the server starts: both take seconds, much of it waiting.
const [starting, building] = await Promise.allSettled([startPostgresServer(choice), buildCheckout()])
if (starting.status === 'rejected' || building.status === 'rejected') {
  if (starting.status === 'rejected') console.error(`test database: could not start: ${errorChain(starting.reason)}`)
  if (building.status === 'rejected') console.error(`the build of the checkout failed: ${errorChain(building.reason)}`)
  if (starting.status === 'fulfilled') await starting.value.stop()
  if (building.status === 'fulfilled') await rm(building.value, { recursive: true, force: true })
  process.exit(1)
}
const server: PostgresServer = starting.value
const built = building.value
const seconds = ((Date.now() - started) / 1000).toFixed(1)
console.log(
  `test database: ${server.source} server ready and checkout built after ${seconds} s; one database per test file`
)

let exitCode = 1
if (signalled === undefined) {
  tap = spawn(process.execPath, [tapBin, ...args], {
    stdio: 'inherit',
    env: {
      ...process.env,
      [SERVER_URL_VARIABLE]: server.url,
      [SERVER_SOURCE_VARIABLE]: server.source,
      [BUILT_CHECKOUT_VARIABLE]: built
    }
  })
  exitCode = await new Promise<number>(resolve => {
    tap?.on('exit', (code, signal) => {
      resolve(code ?? exitCodeFor(signal ?? 'SIGTERM'))
    })
    tap?.on('error', err => {
      console.error(`could not run tap: ${err.message}`)
      resolve(1)
    })
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
await rm(built, { recursive: true, force: true })
process.exit(exitCode)
