import { Writable } from 'node:stream'
import type { FastifyInstance } from 'fastify'
import { Registry } from 'prom-client'
import { buildApp } from '../../src/app.js'
import { loadConfig } from '../../src/config.js'
import { runMigrations } from '../../src/db/migrate.js'
import { until } from './until.js'

export { until }

export const TEST_KEY = 'test-key-0123456789'
export const OTHER_KEY = 'other-key-9876543210'
export const AUTH = { authorization: `Bearer ${TEST_KEY}` }

const quietMigrations = { info: () => {}, warn: () => {}, error: () => {} }

interface Teardown {
  teardown: (fn: () => Promise<void> | void) => void
}

/** Every log line the app wrote, parsed. */
export interface CapturedLogs {
  lines: string[]
}

/**
 * The app exactly as production builds it: configuration through loadConfig
 * (the same parsing and defaults) and the same buildApp factory. `env` adds or
 * overrides variables.
 */
export async function testApp (
  t: Teardown,
  databaseUrl: string,
  env: Record<string, string> = {},
  extra: { register?: (app: FastifyInstance) => Promise<void> } = {}
): Promise<{ app: FastifyInstance; logs: CapturedLogs }> {
  const logs: CapturedLogs = { lines: [] }
  const logStream = new Writable({
    write (chunk: Buffer, _encoding, callback) {
      logs.lines.push(
        ...chunk
          .toString('utf8')
          .split('\n')
          .filter(line => line !== '')
      )
      callback()
    }
  })
  const config = loadConfig({
    DATABASE_URL: databaseUrl,
    API_KEYS: `${TEST_KEY},${OTHER_KEY}`,
    LOG_LEVEL: 'warn',
    METRICS_PORT: '0',
    ...env
  })
  if (config.databaseUrl === undefined) throw new Error('testApp needs a database URL')
  // As server.ts does: the migrations, then the app.
  await runMigrations(config.databaseDirectUrl ?? config.databaseUrl, quietMigrations, {
    statementTimeoutMs: config.db.statementTimeoutMs
  })
  const app = await buildApp({ ...config, databaseUrl: config.databaseUrl }, { logStream })
  t.teardown(async () => {
    await app.close()
  })
  // More of what the service could be made of (test-only resources), before it is ready.
  await extra.register?.(app)
  // Before ready, as server.ts does: ready starts the feed, whose list builds would compete for a small pool.
  await app.verifyTables()
  await app.ready()
  // As a balancer would: nothing is sent before the instance is ready, its lists built (or the feed deaf).
  await until("the app's lists are built (a warm start)", async () => app.listsWarm())
  return { app, logs }
}

/** testApp, listening on a loopback port of its own: for tests that need a real socket. */
export async function listeningApp (
  t: Teardown,
  databaseUrl: string,
  env: Record<string, string> = {},
  extra: { register?: (app: FastifyInstance) => Promise<void> } = {}
): Promise<{ app: FastifyInstance; port: number; logs: CapturedLogs }> {
  const { app, logs } = await testApp(t, databaseUrl, env, extra)
  await app.listen({ port: 0, host: '127.0.0.1' })
  const address = app.server.address()
  if (address === null || typeof address === 'string') throw new Error('no port')
  return { app, port: address.port, logs }
}

export function json (body: unknown): { headers: Record<string, string>; payload: string } {
  return { headers: { ...AUTH, 'content-type': 'application/json' }, payload: JSON.stringify(body) }
}

/** A metric's value (the series with these labels) from an app's registry, or from a registry of its own; 0 when
 * absent. */
export async function metric (
  from: FastifyInstance | Registry,
  name: string,
  labels: Record<string, string> = {}
): Promise<number> {
  const registry = from instanceof Registry ? from : from.metrics
  const values = (await registry.getSingleMetric(name)?.get())?.values ?? []
  return values.find(v => Object.entries(labels).every(([k, l]) => v.labels[k] === l))?.value ?? 0
}

/** A histogram's count and sum (the series whose labels equal these as text: `status` is a number there), from an app's
 * registry or one of its own; 0 when absent. */
export async function histogram (
  from: FastifyInstance | Registry,
  name: string,
  labels: Record<string, string> = {}
): Promise<{ count: number; sum: number }> {
  const registry = from instanceof Registry ? from : from.metrics
  const values = ((await registry.getSingleMetric(name)?.get())?.values ?? []) as Array<{
    metricName?: string
    labels: Record<string, unknown>
    value: number
  }>
  const series = (suffix: string): number =>
    values.find(
      v => v.metricName === `${name}_${suffix}` && Object.entries(labels).every(([k, l]) => String(v.labels[k]) === l)
    )?.value ?? 0
  return { count: series('count'), sum: series('sum') }
}
