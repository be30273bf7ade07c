import { createHash } from 'node:crypto'
import { Writable } from 'node:stream'
import { pipeline } from 'node:stream/promises'
import pg from 'pg'
import { to as copyTo } from 'pg-copy-streams'
import t from 'tap'
import { JsonCopyWriter } from '../../src/db/json-copy.js'
import { inTurns } from '../../src/http/replies.js'
import { testDatabase } from '../helpers/database.js'

// A build lets the event loop turn while it writes, and so does the send of a built list: a liveness probe must not
// wait for a whole list.
const ROWS = 200_000
const db = await testDatabase(t)
const client = new pg.Client({ connectionString: db.url })
await client.connect()
t.teardown(async () => {
  await client.end()
})
await client.query('CREATE TABLE long_list (id bigint PRIMARY KEY, name text NOT NULL)')
await client.query(
  `INSERT INTO long_list SELECT i, repeat('a name of some length ', 4) || i FROM generate_series(1, ${ROWS}) i`
)
const chunks: Buffer[] = []
const sql = 'COPY (SELECT id, name FROM long_list ORDER BY id) TO STDOUT (FORMAT binary)'
for await (const chunk of client.query(copyTo(sql))) chunks.push(chunk as Buffer)

/** Counts the turns of the event loop until the returned function is called, which answers the count. */
function countTurns (): () => number {
  let turns = 0
  let counting = true
  const turn = (): void => {
    turns++
    if (counting) setImmediate(turn)
  }
  setImmediate(turn)
  return () => {
    counting = false
    return turns
  }
}

t.test('the writer yields to the event loop while it writes a long list', async t => {
  // PostgreSQL's bytes again, all at hand: between them nothing but the writer itself can let the event loop in.
  const replay = { query: () => chunks } as unknown as pg.ClientBase
  const turns = countTurns()
  let bytes = 0
  const writer = new JsonCopyWriter({ name: 'text' }, 1024, segment => {
    bytes += segment.bytes.length
  })
  await writer.copy(replay, sql)
  writer.finish()
  const during = turns()
  t.equal(writer.copied, ROWS, 'every row written')
  t.ok(bytes > 100 * ROWS, `${bytes} bytes of JSON`)
  t.ok(during >= 2, `the event loop turned ${during} times during the build`)
})

t.test('rows split anywhere between chunks, the header too, are written as from whole chunks', async t => {
  const few = 'COPY (SELECT id, name FROM long_list ORDER BY id LIMIT 300) TO STDOUT (FORMAT binary)'
  const received: Buffer[] = []
  for await (const chunk of client.query(copyTo(few))) received.push(chunk as Buffer)
  const whole = Buffer.concat(received)
  // Pieces of 1 to 37 bytes: every row, and the 19-byte header, is cut at some offset or other.
  const pieces: Buffer[] = []
  for (let at = 0, size = 1; at < whole.length; at += size, size = size % 37 + 1) {
    pieces.push(whole.subarray(at, at + size))
  }
  const written = async (chunks: Buffer[]): Promise<string> => {
    const segments: Buffer[] = []
    const writer = new JsonCopyWriter({ name: 'text' }, 64, segment => { segments.push(segment.bytes) })
    await writer.copy({ query: () => chunks } as unknown as pg.ClientBase, few)
    writer.finish()
    return segments.join('|')
  }
  const expected = await written([whole])
  t.match(expected, /^\{"id":1,"name":"a name of some length /, 'the rows, from one chunk')
  t.equal(await written(pieces), expected, `the same from ${pieces.length} pieces`)
})

t.test('a long list is sent in turns of the event loop, even to a reader that takes each part at once', async t => {
  // A socket whose reader keeps up ends each write at once: here a hash stands in for it.
  const parts = Array.from({ length: 2000 }, (_, i) => Buffer.alloc(64 * 1024, i % 256))
  const hash = createHash('sha256')
  const reader = new Writable({
    write (part: Buffer, _encoding, done) {
      hash.update(part)
      done()
    }
  })
  const turns = countTurns()
  await pipeline(inTurns(parts), reader)
  const during = turns()
  t.equal(hash.digest('hex'), createHash('sha256').update(Buffer.concat(parts)).digest('hex'), 'every part, in order')
  t.ok(during >= 2, `the event loop turned ${during} times while 125 MB were sent`)
})
