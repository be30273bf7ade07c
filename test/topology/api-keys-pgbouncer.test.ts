import t from 'tap'
import { sha256 } from '../../src/config.js'
import { generateKey, keyPrefix } from '../../src/keys/store.js'
import { testApp, until } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { withClient } from '../helpers/pg-client.js'
import { ensurePgBouncer, startPgBouncer, type PoolMode } from './helpers/pgbouncer.js'

/*
 * Managed keys through PgBouncer, the pool and the change feed both on the pooler (no DATABASE_DIRECT_URL): in
 * transaction pooling the feed hears nothing, so each instance reads the keys every 250 ms; a change must still
 * hold on both instances within a second.
 */

const FOLLOW_MS = 1000
t.comment(ensurePgBouncer())
const db = await testDatabase(t)

for (const mode of ['transaction', 'session'] as PoolMode[]) {
  t.test(`PgBouncer, ${mode} pooling: a key created and revoked holds on both instances within a second`, async t => {
    const bouncer = await startPgBouncer(t, db.url, mode)
    const url = await db.createDatabase()
    // Every refused poll below is a failed authentication: the limit must not be what answers.
    const env = { RATE_LIMIT_AUTH_FAILURES: '1000000' }
    const apps = [(await testApp(t, bouncer.urlFor(url), env)).app, (await testApp(t, bouncer.urlFor(url), env)).app]
    if (mode === 'session') await until('both feeds hear', async () => apps.every(app => app.changeFeed.listening))
    const key = generateKey()
    const status = async (app: typeof apps[number]): Promise<number> =>
      (await app.inject({ url: '/v1/categories', headers: { authorization: `Bearer ${key}` } })).statusCode
    const follows = async (expected: number, what: string): Promise<void> => {
      const started = performance.now()
      for (const app of apps) await until(`${what}: ${expected}`, async () => await status(app) === expected, 5000, 10)
      const ms = performance.now() - started
      t.ok(ms < FOLLOW_MS, `${what} on both within ${FOLLOW_MS} ms (${Math.round(ms)} ms)`)
    }
    await withClient(url, async client => {
      await client.query('INSERT INTO api_keys (name, scope, prefix, digest) VALUES (\'pooled\', \'read\', $1, $2)',
        [keyPrefix(key), sha256(key)])
    })
    await follows(200, 'created key accepted')
    await withClient(url, async client => { await client.query('UPDATE api_keys SET revoked_at = now()') })
    await follows(401, 'revoked key refused')
  })
}
