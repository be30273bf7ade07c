import { randomBytes } from 'node:crypto'
import t from 'tap'
import { until } from '../helpers/until.js'
import { DebianCluster } from './helpers/clusters.js'
import { startInstances } from './helpers/instances.js'

/*
 * With synchronous replication a commit waits until the standby has it. When
 * the standby is gone the wait does not end: the service must answer 503 in
 * bounded time (its client-side query timeout; PostgreSQL's statement_timeout
 * does not cover a commit's wait), the outcome unknown. And when that wait is
 * cancelled (an operator's pg_cancel_backend on sessions that "hang"),
 * PostgreSQL reports the commit as done with only a warning: the row then
 * exists on the primary alone, and a failover would lose it. Such a create
 * must not be acknowledged either. Its Idempotency-Key replays it once it is
 * replicated.
 */

const STATEMENT_TIMEOUT_MS = 3000

t.test('a commit the synchronous standby never confirmed is a 503, not a 201', async t => {
  const primary = await DebianCluster.create(t, 'sync_primary')
  const standby = await primary.createStandby(t, 'sync_standby')
  await primary.requireSynchronousStandby()
  await primary.query('CREATE DATABASE petstore')
  const apiKey = `topology-${randomBytes(8).toString('hex')}`
  const [instance] = (
    await startInstances(t, {
      count: 1,
      databaseUrl: primary.url('petstore'),
      apiKey,
      env: { DB_STATEMENT_TIMEOUT_MS: String(STATEMENT_TIMEOUT_MS) }
    })
  ).list
  const create = async (
    name: string,
    key?: string
  ): Promise<{ status: number; body: string; replayed: boolean; ms: number }> => {
    const started = performance.now()
    const res = await fetch(`${instance?.url ?? ''}/v1/categories`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${apiKey}`,
        'content-type': 'application/json',
        ...(key === undefined ? {} : { 'idempotency-key': key })
      },
      body: JSON.stringify({ name }),
      signal: AbortSignal.timeout(15_000)
    })
    return {
      status: res.status,
      body: await res.text(),
      replayed: res.headers.get('idempotent-replayed') === 'true',
      ms: performance.now() - started
    }
  }
  const rowsNamed = async (name: string): Promise<number> =>
    (
      await primary.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM categories WHERE name = $1',
        [name],
        'petstore'
      )
    )[0]?.n ?? -1

  t.equal((await create('replicated')).status, 201, 'with the standby: 201')
  await standby.stop('fast')
  // An operator cancels the sessions that "hang" (their commits wait for the standby): PostgreSQL then calls them
  // committed.
  const waiters = async (): Promise<number> =>
    (
      await primary.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE wait_event = 'SyncRep' AND application_name LIKE 'petstore/%'`)
    )[0]?.n ?? 0
  const cancelled = create('cancelled')
  const waiting = async (): Promise<boolean> => (await waiters()) > 0
  await t.resolves(until('a create waits for the standby', waiting, 10000, 10), 'the create waits for the standby')
  await primary.query(`SELECT pg_cancel_backend(pid) FROM pg_stat_activity
    WHERE wait_event = 'SyncRep' AND application_name LIKE 'petstore/%'`)
  const answer = await cancelled
  t.equal(answer.status, 503, `a commit the standby never confirmed is not acknowledged: ${answer.body}`)
  t.equal(await rowsNamed('cancelled'), 1, 'though PostgreSQL committed it on the primary alone')

  // Left alone, commits wait (the first holds the NOTIFY queue's lock until its wait ends, and the others wait for it).
  for (const [name, key] of [
    ['waiting', undefined],
    ['waiting with key', 'sync-1']
  ] as const) {
    const res = await create(name, key)
    t.equal(res.status, 503, `${key === undefined ? 'create' : 'keyed create'} without the standby: ${res.body}`)
    t.ok(res.ms < STATEMENT_TIMEOUT_MS + 3000, `answered in ${Math.round(res.ms)} ms, not left hanging`)
  }

  await standby.start()
  await primary.requireSynchronousStandby()
  // As a client does: retry on 409/503 (the waiting commit may still be finishing).
  let retried = await create('waiting with key', 'sync-1')
  for (let i = 0; i < 20 && (retried.status === 409 || retried.status === 503); i++) {
    await new Promise(resolve => setTimeout(resolve, 500))
    retried = await create('waiting with key', 'sync-1')
  }
  t.equal(retried.status, 201, 'once replicated, the retry of the key is answered')
  t.ok(retried.replayed, 'by replaying the committed create')
  t.equal(await rowsNamed('waiting with key'), 1, 'no second row')
  t.equal((await create('after')).status, 201, 'creates work again')
})
