import { Type } from 'typebox'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { MIGRATIONS_TABLE, migrationNames } from '../db/migrate.js'
import { errorResponses, serviceUnavailable } from './errors.js'

const Status = Type.Object({ status: Type.Literal('ok') })

// Ready: not draining (the balancer then sends elsewhere), the database takes writes and has every migration applied.
async function health (app: FastifyInstance): Promise<void> {
  const migrations = await migrationNames()
  const schema = { hide: true, response: { 200: Status, ...errorResponses([503]) } }
  app.get('/health/live', { schema, logLevel: 'warn' }, async () => ({ status: 'ok' as const }))
  app.get('/health/ready', { schema, logLevel: 'warn' }, async () => {
    if (app.lifecycle.shuttingDown) throw serviceUnavailable('shutting down')
    const { rows } = await app.db.query<{ applied: number, writable: boolean }>(
      `SELECT count(name)::int AS applied,
         NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off' AS writable
       FROM ${MIGRATIONS_TABLE} WHERE name = ANY($1)`, [migrations])
    // A standby (in recovery) or a read-only database answers reads and this query, but refuses every create.
    if (rows[0]?.writable !== true) {
      throw serviceUnavailable('the database cannot take writes (read-only, or a standby in recovery)')
    }
    if (rows[0].applied !== migrations.length) throw serviceUnavailable('database migrations are not applied')
    return { status: 'ok' as const }
  })
}

export default fp(health, { name: 'health', dependencies: ['data', 'lifecycle'] })
