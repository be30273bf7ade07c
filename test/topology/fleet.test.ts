import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { categoryJson, categoryRows } from '../helpers/list-body.js'
import { withClient } from '../helpers/pg-client.js'
import { until } from '../helpers/until.js'
import { DebianCluster } from './helpers/clusters.js'
import { startInstances, type Instance } from './helpers/instances.js'
import { auditLoad, startLoad, tableRows } from './helpers/load.js'

/*
 * Three instances on one database, as behind a balancer (the load spreads its
 * requests over them in turn), under creates through every instance, with a
 * transaction that takes an id and commits after later ids have committed, and a
 * statement inserting many rows at once. Every instance's list must then be byte
 * for byte the database's, with the same ETag, and no instance may have rebuilt
 * its list after it first built it: creates from anywhere extend it.
 */

const SEED_ROWS = 5000
const LOAD_MS = 5000

async function metric (instance: Instance, name: string, labels: string): Promise<number> {
  const text = await (await fetch(instance.metricsUrl ?? '')).text()
  const line = text.split('\n').find(l => l.startsWith(`${name}${labels} `))
  return line === undefined ? 0 : Number(line.split(' ').pop())
}

t.test(
  "a fleet of three: creates from any instance, committed in any order, reach every instance's list without a rebuild",
  async t => {
    const cluster = await DebianCluster.create(t, 'fleet')
    await cluster.query('CREATE DATABASE petstore')
    const databaseUrl = cluster.url('petstore')
    const apiKey = `topology-${randomBytes(8).toString('hex')}`
    const instances = await startInstances(t, { count: 3, databaseUrl, apiKey, metrics: true })
    await cluster.query(
      `INSERT INTO categories (name, description)
      SELECT 'seeded ' || i, CASE WHEN i % 3 = 0 THEN 'd' || i END FROM generate_series(1, $1::int) AS i`,
      [SEED_ROWS],
      'petstore'
    )
    const get = async (instance: Instance): Promise<{ status: number; body: string; etag: string | null }> => {
      const res = await fetch(`${instance.url}/v1/categories`, {
        headers: { authorization: `Bearer ${apiKey}` },
        signal: AbortSignal.timeout(10_000)
      })
      return { status: res.status, body: await res.text(), etag: res.headers.get('etag') }
    }
    const refreshes = async (): Promise<number[]> =>
      await Promise.all(
        instances.list.map(async i => await metric(i, 'categories_list_reads_total', '{source="refresh"}'))
      )
    // Each instance builds its list once it hears (the seed's insert said "too many" rows: every instance dropped its
    // list).
    for (const instance of instances.list) {
      const listening = async (): Promise<boolean> => (await metric(instance, 'change_feed_listening', '')) === 1
      await until('the instance listens', listening, 30000, 50)
      await get(instance)
    }
    const built = await refreshes()
    const before = await tableRows(databaseUrl)

    const load = startLoad(t, { targets: instances.urls, apiKey })
    // An id taken now and committed after the load's later ids; and one statement inserting many rows at once.
    const early = await withClient(databaseUrl, async client => {
      await client.query('BEGIN')
      const { rows } = await client.query<{ id: string }>(
        "INSERT INTO categories (name) VALUES ('taken early') RETURNING id::text"
      )
      await sleep(LOAD_MS / 2)
      await client.query("INSERT INTO categories (name) SELECT 'batch ' || i FROM generate_series(1, 50) AS i")
      await sleep(LOAD_MS / 2)
      await client.query('COMMIT')
      return rows[0]?.id
    })
    const result = await load.stop()
    // The test's own writes are not the load's.
    for (const name of ['taken early', ...Array.from({ length: 50 }, (_, i) => `batch ${i + 1}`)]) {
      result.sentNames.add(name)
    }
    await auditLoad(t, result, { databaseUrl, instances, before, stopInstances: false })

    const rows = await withClient(databaseUrl, categoryRows)
    t.ok(
      rows.some(row => row.id === early && BigInt(early) < BigInt(rows.at(-1)?.id ?? 0)),
      `the early id ${early ?? ''} committed after later ids`
    )
    const expected = `[${rows.map(categoryJson).join(',')}]`
    let answers = await Promise.all(instances.list.map(get))
    for (let i = 0; i < 40 && answers.some(a => a.body !== expected); i++) {
      await sleep(50)
      answers = await Promise.all(instances.list.map(get))
    }
    answers.forEach((answer, i) => {
      t.equal(answer.status, 200)
      t.ok(
        answer.body === expected,
        `${instances.list[i]?.name ?? ''}: byte for byte the database's list (${rows.length} rows)`
      )
    })
    t.equal(new Set(answers.map(a => a.etag)).size, 1, 'the same ETag on every instance')
    t.same(await refreshes(), built, 'no instance rebuilt its list: every create, in any order, was added to it')
    for (const stopped of await instances.stop()) t.equal(stopped.code, 0, `${stopped.name} exits 0 on SIGTERM`)
  }
)
