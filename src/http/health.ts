import { Type } from 'typebox'
import type { FastifyInstance } from 'fastify'
import { MIGRATIONS_TABLE } from '../db/migrate.js'
import { errorResponses, serviceUnavailable } from './errors.js'
import type { Lifecycle } from './lifecycle.js'

const Status = Type.Object({ status: Type.Literal('ok') })

/**
 * Liveness: the process answers. Readiness: the database answers, takes
 * writes and has every migration applied, and the instance is not shutting
 * down (a load balancer then stops sending it traffic while it drains).
 */
export function registerHealthRoutes (app: FastifyInstance, deps: { migrations: string[], lifecycle: Lifecycle }): void {
  const schema = { hide: true, response: { 200: Status, ...errorResponses([503]) } }
  app.get('/health/live', { schema, logLevel: 'warn' }, async () => ({ status: 'ok' as const }))
  app.get('/health/ready', { schema, logLevel: 'warn' }, async () => {
    if (deps.lifecycle.shuttingDown) throw serviceUnavailable('shutting down')
    const { rows } = await app.db.query<{ applied: number, writable: boolean }>(
      `SELECT count(name)::int AS applied, NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off' AS writable
       FROM ${MIGRATIONS_TABLE} WHERE name = ANY($1)`, [deps.migrations])
    // A standby (in recovery) or a read-only database answers reads and this query, but refuses every create.
    if (rows[0]?.writable !== true) throw serviceUnavailable('the database cannot take writes (read-only, or a standby in recovery)')
    if (rows[0].applied !== deps.migrations.length) throw serviceUnavailable('database migrations are not applied')
    return { status: 'ok' as const }
  })
}
