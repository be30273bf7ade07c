import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { mkdir, readFile, writeFile } from 'node:fs/promises'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import closeWithGrace from 'close-with-grace'
import type { DataDirLock } from '@petstore/embedded-postgres'
import type { FastifyInstance } from 'fastify'
import { buildApp } from './app.js'
import { loadConfig, sha256, type Config } from './config.js'
import { checkStatementTimeout, runMigrations } from './db/migrate.js'
import { loadEmbedded } from './embedded.js'
import { startMetricsServer } from './http/metrics.js'
import { checkDatabase, checkPortFree, describeBuildError, listenFailed } from './startup-checks.js'
import { reportStartupFailure } from './startup-error.js'
import { telemetry } from './telemetry.js'

// Configuration, the fast checks, the slow steps, listen: a failure on the way is one line and exit 1.

// The app once it listens (a shutdown before that only stops what has started); how to stop each step, in order.
let listening: FastifyInstance | undefined
const undo: Array<() => Promise<unknown>> = []

async function readOrCreateDevKey (file: string): Promise<{ value: string, created: boolean }> {
  if (existsSync(file)) return { value: (await readFile(file, 'utf8')).trim(), created: false }
  await mkdir(path.dirname(file), { recursive: true })
  const value = `dev_${randomBytes(24).toString('base64url')}`
  await writeFile(file, value + '\n', { mode: 0o600 })
  return { value, created: true }
}

async function start (config: Config): Promise<void> {
  const debug = config.logLevel === 'debug' || config.logLevel === 'trace'
  const dataDir = path.resolve(config.dataDir)
  const asked = `http://${config.host}:${config.port}`
  const checkPorts = async (): Promise<void> => {
    await checkPortFree('PORT', config.host, config.port)
    await checkPortFree('METRICS_PORT', config.metrics.host, config.metrics.port)
  }

  let databaseUrl = config.databaseUrl
  let lock: DataDirLock | undefined
  if (databaseUrl === undefined) {
    const embedded = await loadEmbedded()
    // The embedded database belongs to one process at a time: a second start is refused before it touches anything.
    lock = await embedded.lockDataDir(dataDir, asked).catch(embedded.refused)
    undo.push(lock.release)
    await checkPorts()
    console.log(`petstore: DATABASE_URL is not set; starting the embedded PostgreSQL (data in ${dataDir})`)
    const postgresLog = debug ? (line: string) => { process.stderr.write(`postgres: ${line}\n`) } : undefined
    const database = await embedded.startEmbeddedPostgres({ dir: dataDir, lock, log: postgresLog })
      .catch(embedded.refused)
    undo.push(database.stop)
    databaseUrl = database.serviceUrl
  } else {
    await checkPorts()
    await checkDatabase(databaseUrl)
  }
  const devKeyFile = path.join(dataDir, 'dev-api-key')
  const devKey = config.apiKeyDigests.length === 0 ? await readOrCreateDevKey(devKeyFile) : undefined
  const apiKeyDigests = devKey === undefined ? config.apiKeyDigests : [sha256(devKey.value)]

  const url = databaseUrl
  const oneLine = (err: unknown): never => { throw describeBuildError(err, url) }
  // A failed migration is thrown and reported in one line; the runner's own account is a detail.
  await runMigrations(config.databaseDirectUrl ?? url, {
    info: (msg) => { if (debug) console.log(`petstore: ${msg}`) },
    warn: (msg) => { console.warn(`petstore: ${msg}`) },
    error: (msg) => { if (debug) console.error(`petstore: ${msg}`) }
  }, { statementTimeoutMs: config.db.statementTimeoutMs }).catch(oneLine)
  const app = await buildApp({ ...config, apiKeyDigests, databaseUrl: url }).catch(oneLine)
  undo.push(async () => { await app.close() })
  await app.verifyTables().catch(oneLine)
  await checkStatementTimeout(app.db, config.db.statementTimeoutMs, app.log)
  const metrics = await startMetricsServer(app.metrics, config.metrics)
    .catch(listenFailed('METRICS_PORT', config.metrics.host, config.metrics.port))
  undo.push(async () => { metrics?.close() })
  await app.listen({ port: config.port, host: config.host }).catch(listenFailed('PORT', config.host, config.port))
  listening = app
  // With PORT=0 the system chose the port: the lock and the hint name the one it chose.
  const bound = app.addresses()[0]
  const address = `http://${config.host}:${typeof bound === 'object' ? bound.port : config.port}`
  await lock?.record({ address })
  if (process.versions.node.startsWith('20.')) {
    app.log.warn(`Node.js ${process.versions.node} is past its end of life; run the service on Node.js 22 or 24`)
  }
  if (devKey !== undefined) {
    const shown = `${devKey.created ? 'created a development API key' : 'development API key'} (kept in ${devKeyFile})`
    console.log(`\npetstore: ${shown}:\n\n    ${devKey.value}\n\n` +
      `  try: curl -H 'Authorization: Bearer ${devKey.value}' ${address}/v1/categories\n`)
  }
}

async function undoAll (onError: (err: unknown) => void = () => {}): Promise<void> {
  for (const step of undo.splice(0).reverse()) await step().catch(onError)
}

let config: Config
try {
  config = loadConfig()
} catch (err) {
  reportStartupFailure(err, process.env.LOG_LEVEL)
  process.exit(1)
}
const logger = {
  error: (m: string) => {
    if (listening === undefined) console.error(`petstore: ${m}`)
    else listening.log.error(m)
  }
}
// When the shutdown began: Ctrl-C reaches every process of the terminal's group, and a watcher (npm run dev) relays
// it to the service, which has it already. A SIGINT within RELAYED_SIGINT_MS of that is the same Ctrl-C.
const RELAYED_SIGINT_MS = 1000
let stoppingSince: number | undefined
const closer = closeWithGrace({ delay: config.shutdown.drainMs + config.shutdown.timeoutMs, logger, skip: ['SIGINT'] },
  async ({ signal, err }) => {
    stoppingSince = performance.now()
    const app = listening
    if (app === undefined) {
      // Interrupted while starting (a signal, an uncaught error): stop what was started, nothing to drain.
      if (err !== undefined) reportStartupFailure(err, config.logLevel)
      await undoAll()
      return
    }
    const drainMs = config.shutdown.drainMs
    if (err !== undefined) app.log.error({ err }, 'fatal error, shutting down')
    else app.log.info({ signal: signal ?? 'SIGINT', drainMs }, 'shutting down: readiness is now 503, draining')
    // Keep serving while the balancer notices the failing readiness check, then close.
    app.lifecycle.shuttingDown = true
    if (err === undefined) await sleep(drainMs)
    let failed = false
    await undoAll((err) => {
      failed = true
      app.log.error({ err }, 'shutdown step failed')
    })
    // The last spans: the batch exporter sends only every few seconds.
    await telemetry?.shutdown().catch((err: unknown) => { app.log.warn({ err }, 'traces not flushed') })
    // close-with-grace exits 1 when the handler throws.
    if (failed) throw new Error('shutdown incomplete: a step failed (see above)')
    app.log.info('shutdown complete')
  })
// SIGINT is ours (close-with-grace's skip): the first one closes, a later one while stopping forces the exit.
process.on('SIGINT', () => {
  if (stoppingSince === undefined) {
    closer.close()
    return
  }
  if (performance.now() - stoppingSince < RELAYED_SIGINT_MS) return
  logger.error('second SIGINT, exiting')
  process.exit(1)
})
try {
  await start(config)
} catch (err) {
  reportStartupFailure(err, config.logLevel)
  await undoAll()
  process.exit(1)
}
