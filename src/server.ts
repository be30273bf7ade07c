import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import closeWithGrace from 'close-with-grace'
import { buildApp } from './app.js'
import { ConfigError, loadConfig, sha256, type Config } from './config.js'
import { startEmbeddedPostgres, type EmbeddedDatabase } from './db/embedded.js'
import { readOrCreateSecret } from './dev-secrets.js'
import { startMetricsServer } from './http/metrics.js'

async function main (): Promise<void> {
  let config: Config
  try {
    config = loadConfig()
  } catch (err) {
    if (err instanceof ConfigError) {
      console.error(`petstore: ${err.message}`)
      process.exit(1)
    }
    throw err
  }

  let embedded: EmbeddedDatabase | undefined
  let databaseUrl = config.databaseUrl
  if (databaseUrl === undefined) {
    console.log(`petstore: DATABASE_URL is not set; starting the embedded PostgreSQL (data in ${path.resolve(config.dataDir, 'postgres')})`)
    embedded = await startEmbeddedPostgres({ dir: config.dataDir })
    databaseUrl = embedded.url
  }
  // Outside production with no key configured: one random key, created once and kept under the data directory.
  const devKeyFile = path.join(config.dataDir, 'dev-api-key')
  let devKey: { value: string, created: boolean } | undefined
  if (config.apiKeyDigests.length === 0) {
    devKey = await readOrCreateSecret(devKeyFile, 'dev_')
    config.apiKeyDigests = [sha256(devKey.value)]
  }

  const app = await buildApp({ ...config, databaseUrl })
  const metrics = await startMetricsServer(app.metrics, config.metrics)

  closeWithGrace({ delay: config.shutdown.drainMs + config.shutdown.timeoutMs, logger: { error: (m: string) => { app.log.error(m) } } },
    async ({ signal, err }) => {
      if (err !== undefined) app.log.error({ err }, 'fatal error, shutting down')
      else app.log.info({ signal, drainMs: config.shutdown.drainMs }, 'shutting down: readiness is now 503, draining')
      // Keep serving while the balancer notices the failing readiness check, then close.
      app.lifecycle.shuttingDown = true
      if (err === undefined) await sleep(config.shutdown.drainMs)
      await app.close()
      metrics?.close()
      await embedded?.stop()
      app.log.info('shutdown complete')
    })

  await app.listen({ port: config.port, host: config.host })
  if (devKey !== undefined) {
    const shown = `${devKey.created ? 'created a development API key' : 'development API key'} (kept in ${devKeyFile})`
    console.log(`\npetstore: ${shown}:\n\n    ${devKey.value}\n\n  try: curl -H 'Authorization: Bearer ${devKey.value}' http://${config.host}:${config.port}/v1/categories\n`)
  }
}

await main()
