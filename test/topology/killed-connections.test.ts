import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { DebianCluster } from './helpers/clusters.js'
import { startInstances } from './helpers/instances.js'
import { auditLoad, startLoad, tableRows } from './helpers/load.js'

/*
 * Two instances under a load of creates (most with an Idempotency-Key) and
 * lists while the service's backends are terminated every few hundred
 * milliseconds, as a failover, a restart or an operator does, and while a
 * long list is being built (COPY in one snapshot).
 */

const LOAD_MS = Number(process.env.TOPOLOGY_LOAD_MS ?? 15_000)
const SEED_ROWS = 3000

t.test('backends terminated every few hundred ms under load: no exit, no 500, nothing acknowledged lost', async t => {
  const cluster = await DebianCluster.create(t, 'killed')
  await cluster.query('CREATE DATABASE petstore')
  const databaseUrl = cluster.url('petstore')
  const apiKey = `topology-${randomBytes(8).toString('hex')}`
  const instances = await startInstances(t, { count: 2, databaseUrl, apiKey })
  // A long list: every list read from the database is a build (one snapshot, COPY).
  await cluster.query(
    "INSERT INTO categories (name) SELECT 'seeded ' || i FROM generate_series(1, $1::int) AS i",
    [SEED_ROWS],
    'petstore'
  )
  const before = await tableRows(databaseUrl)

  const load = startLoad(t, { targets: instances.urls, apiKey })
  const killed = { sweeps: 0, backends: 0, cursorReads: 0 }
  const until = performance.now() + LOAD_MS
  // Every 200-400 ms: every backend of the service (its pools and its change feeds).
  const sweeper = (async () => {
    while (performance.now() < until) {
      await sleep(200 + Math.random() * 200)
      const rows = await cluster.query<{ pid: number }>(
        "SELECT pg_terminate_backend(pid) AS pid FROM pg_stat_activity WHERE application_name LIKE 'petstore%'"
      )
      killed.sweeps++
      killed.backends += rows.length
    }
  })()
  // In between, about twice a second: the first backend caught building the list (its snapshot, its COPY).
  const cursorHunter = (async () => {
    while (performance.now() < until) {
      const rows = await cluster.query<{ pid: number }>(
        `SELECT pg_terminate_backend(pid) AS pid FROM pg_stat_activity
        WHERE application_name LIKE 'petstore%' AND state <> 'idle'
          AND (query LIKE 'BEGIN ISOLATION LEVEL REPEATABLE READ%' OR query LIKE 'COPY (SELECT%')`
      )
      killed.cursorReads += rows.length
      await sleep(rows.length > 0 ? 500 : 5)
    }
  })()
  await Promise.all([sweeper, cursorHunter])
  t.comment(
    `terminated ${killed.backends} backends in ${killed.sweeps} sweeps, and ${killed.cursorReads} during a list build`
  )
  t.ok(killed.backends > 0, 'backends were terminated')
  t.ok(killed.cursorReads > 0, 'some while they built the list (COPY in its snapshot)')

  // The database is left alone again: both instances must serve creates within seconds.
  const calm = performance.now()
  await sleep(3000)
  const result = await load.stop()
  const recovered = result.firstCreatedAfter(calm)
  t.comment(`first 201 after the terminations stopped: ${recovered.map(ms => `${ms ?? 'never'} ms`).join(', ')}`)
  t.ok(
    recovered.every(ms => ms !== undefined),
    'every instance serves creates again'
  )

  const figures = await auditLoad(t, result, { databaseUrl, instances, before })
  t.comment(`figures: ${JSON.stringify(figures)}`)
})
