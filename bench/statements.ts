import pg from 'pg'
import { poolClientClass } from '../src/db/pool-client.js'
import { numberFromEnv, startPostgres } from './servers.js'

/*
 * `npm run bench:statements`: what a statement costs on a direct connection, the
 * way the pool sends it (src/db/pool-client.ts) against the way it was sent before
 * (named, prepared once per connection, statement_timeout as a startup parameter).
 * The variants run interleaved in chunks of 50, the order rotating every round, and
 * each prints the median of its chunk means and its ratio to the first. The statements
 * are the service's own shapes: a get by id, a 100-row list, a one-row batch insert.
 * synchronous_commit is off on these connections, so that commit flushes do not
 * drown the difference.
 */

const rounds = numberFromEnv('STATEMENTS_ROUNDS', 40)
const CHUNK = 50
const INSERT = `WITH input AS MATERIALIZED (
  SELECT nextval('bench_statements_id_seq'::regclass) AS id, t.name, t.description, t.ord
  FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(name, description, ord) ORDER BY t.ord
), inserted AS (INSERT INTO bench_statements (id, name, description) SELECT id, name, description FROM input)
SELECT id FROM input ORDER BY ord`
const statements: Record<string, (i: number) => { name: string, text: string, values: unknown[] }> = {
  'get by id': i => ({ name: 'get', text: 'SELECT id, name, description FROM bench_statements WHERE id = $1', values: [String(1 + (i % 100))] }),
  '100-row list': () => ({ name: 'list', text: 'SELECT id, name, description FROM bench_statements WHERE id <= 100 ORDER BY id LIMIT $1', values: [1001] }),
  'one-row insert': i => ({ name: 'insert', text: INSERT, values: [[`row ${i}`], [null]] })
}

const postgres = await startPostgres()
try {
  const url = await postgres.createDatabase('petstore_bench_statements')
  const connect = async (client: pg.Client): Promise<pg.Client> => {
    await client.connect()
    await client.query('SET synchronous_commit = off')
    return client
  }
  const settings = { statementTimeoutMs: 5000, applicationName: 'petstore/bench' }
  const before = await connect(new pg.Client({ connectionString: url, statement_timeout: 5000 }))
  const Unnamed = poolClientClass({ ...settings, preparedStatements: false })
  const Prepared = poolClientClass({ ...settings, preparedStatements: true })
  const unnamed = await connect(new Unnamed({ connectionString: url }))
  const prepared = await connect(new Prepared({ connectionString: url }))
  await before.query('CREATE TABLE bench_statements (id bigserial PRIMARY KEY, name text NOT NULL, description text)')
  await before.query("INSERT INTO bench_statements (name) SELECT 'category ' || i FROM generate_series(1, 100) AS i")
  const variants: Array<[string, (q: { name: string, text: string, values: unknown[] }) => Promise<unknown>]> = [
    ['before: prepared, timeout at startup', async q => await before.query(q)],
    ['unnamed + settings (default)', async q => await unnamed.query({ text: q.text, values: q.values })],
    ['prepared + settings (DB_PREPARED_STATEMENTS=true)', async q => await prepared.query({ text: q.text, values: q.values })]
  ]
  const samples = new Map<string, number[]>()
  let n = 0
  for (let round = 0; round < rounds; round++) {
    for (const [statement, make] of Object.entries(statements)) {
      const order = [...variants.slice(round % variants.length), ...variants.slice(0, round % variants.length)]
      for (const [variant, run] of order) {
        const started = process.hrtime.bigint()
        for (let i = 0; i < CHUNK; i++) await run(make(n++))
        const key = `${statement}\t${variant}`
        samples.set(key, [...(samples.get(key) ?? []), Number(process.hrtime.bigint() - started) / 1000 / CHUNK])
      }
    }
  }
  const median = (values: number[]): number => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? NaN
  console.log(`PostgreSQL ${postgres.version} (${postgres.source}), ${rounds} rounds of ${CHUNK} per variant`)
  for (const statement of Object.keys(statements)) {
    const base = median(samples.get(`${statement}\t${variants[0]?.[0] ?? ''}`) ?? [])
    for (const [variant] of variants) {
      const value = median(samples.get(`${statement}\t${variant}`) ?? [])
      console.log(`${statement.padEnd(15)} ${variant.padEnd(50)} ${value.toFixed(1).padStart(7)} µs  ×${(value / base).toFixed(2)}`)
    }
  }
  await Promise.all([before.end(), unnamed.end(), prepared.end()])
} finally {
  await postgres.stop()
}
