import pg from 'pg'
import { to as copyTo } from 'pg-copy-streams'
import t from 'tap'
import { JsonCopyWriter } from '../src/db/json-copy.js'
import { testDatabase } from './helpers/database.js'

// A build lets the event loop turn while it writes: a liveness probe must not wait for a whole list.
const ROWS = 200_000
const db = await testDatabase(t)
const client = new pg.Client({ connectionString: db.url })
await client.connect()
t.teardown(async () => { await client.end() })
await client.query('CREATE TABLE long_list (id bigint PRIMARY KEY, name text NOT NULL)')
await client.query(`INSERT INTO long_list SELECT i, repeat('a name of some length ', 4) || i FROM generate_series(1, ${ROWS}) i`)
const chunks: Buffer[] = []
const sql = 'COPY (SELECT id, name FROM long_list ORDER BY id) TO STDOUT (FORMAT binary)'
for await (const chunk of client.query(copyTo(sql))) chunks.push(chunk as Buffer)

t.test('the writer yields to the event loop while it writes a long list', async t => {
  // PostgreSQL's bytes again, all at hand: between them nothing but the writer itself can let the event loop in.
  const replay = { query: () => chunks } as unknown as pg.ClientBase
  let turns = 0
  let writing = true
  const turn = (): void => {
    turns++
    if (writing) setImmediate(turn)
  }
  setImmediate(turn)
  let bytes = 0
  const writer = new JsonCopyWriter({ name: 'text' }, 1024, segment => { bytes += segment.bytes.length })
  await writer.copy(replay, sql)
  writer.finish()
  writing = false
  t.equal(writer.copied, ROWS, 'every row written')
  t.ok(bytes > 100 * ROWS, `${bytes} bytes of JSON`)
  t.ok(turns >= 2, `the event loop turned ${turns} times during the build`)
})
