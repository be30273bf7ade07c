import { Type } from 'typebox'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { Gauge } from 'prom-client'
import { DATABASE_IN_RECOVERY, DatabaseUnavailableError } from '../db/errors.js'
import { MIGRATIONS_TABLE, migrationNames } from '../db/migrate.js'
import { errorResponses, serviceUnavailable } from './errors.js'

const Status = Type.Object({ status: Type.Literal('ok') })

/** Why an instance is not ready, in the order they are checked (health_not_ready's reason label). */
const REASONS = ['shutting_down', 'database_unavailable', 'database_read_only', 'migrations_not_applied',
  'lists_not_built'] as const
interface NotReady { reason: typeof REASONS[number], error: unknown }

// Ready: not draining (the balancer then sends elsewhere), the database takes writes and has every migration applied,
// and every list was built once.
async function health (app: FastifyInstance): Promise<void> {
  const migrations = await migrationNames()

  /** The one readiness check: GET /health/ready and the health_* gauges both ask it. */
  async function notReady (): Promise<NotReady | undefined> {
    if (app.lifecycle.shuttingDown) return { reason: 'shutting_down', error: serviceUnavailable('shutting down') }
    let row: { applied: number, writable: boolean } | undefined
    try {
      const { rows } = await app.db.query<{ applied: number, writable: boolean }>(
        `SELECT count(name)::int AS applied,
           NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off' AS writable
         FROM ${MIGRATIONS_TABLE} WHERE name = ANY($1)`, [migrations])
      row = rows[0]
    } catch (error) {
      // A new connection that reaches a standby is refused (db/servers.ts): the database is there, but takes no writes.
      const standby = error instanceof DatabaseUnavailableError && error.reason === DATABASE_IN_RECOVERY
      return { reason: standby ? 'database_read_only' : 'database_unavailable', error }
    }
    // A standby (in recovery) or a read-only database answers reads and this query, but refuses every create.
    if (row?.writable !== true) {
      const message = 'the database cannot take writes (read-only, or a standby in recovery)'
      return { reason: 'database_read_only', error: serviceUnavailable(message) }
    }
    if (row.applied !== migrations.length) {
      return { reason: 'migrations_not_applied', error: serviceUnavailable('database migrations are not applied') }
    }
    // A warm start: a balancer sends nothing here before the lists are in memory.
    if (!app.listsWarm()) return { reason: 'lists_not_built', error: serviceUnavailable('the lists are being built') }
    return undefined
  }

  const schema = { hide: true, response: { 200: Status, ...errorResponses([503]) } }
  app.get('/health/live', { schema, logLevel: 'warn' }, async () => ({ status: 'ok' as const }))
  app.get('/health/ready', { schema, logLevel: 'warn' }, async () => {
    const problem = await notReady()
    if (problem !== undefined) throw problem.error
    return { status: 'ok' as const }
  })
  registerReadinessGauges(app, notReady)
}

/** Computed at scrape time by the readiness check itself; one check serves both gauges of a scrape. */
function registerReadinessGauges (app: FastifyInstance, notReady: () => Promise<NotReady | undefined>): void {
  let checking: Promise<NotReady | undefined> | undefined
  const check = async (): Promise<NotReady | undefined> => {
    checking ??= notReady().finally(() => { checking = undefined })
    return await checking
  }
  const registers = [app.metrics]
  /* eslint-disable no-new */
  new Gauge({
    name: 'health_ready',
    help: '1 while GET /health/ready answers 200, 0 while it answers 503',
    registers,
    async collect () {
      this.set((await check()) === undefined ? 1 : 0)
    }
  })
  new Gauge({
    name: 'health_not_ready',
    help: 'Why GET /health/ready answers 503: 1 for the first failing check, 0 for the others',
    labelNames: ['reason'],
    registers,
    async collect () {
      const problem = await check()
      for (const reason of REASONS) this.labels(reason).set(problem?.reason === reason ? 1 : 0)
    }
  })
  /* eslint-enable no-new */
}

export default fp(health, { name: 'health', dependencies: ['data', 'lifecycle', 'metrics'] })
