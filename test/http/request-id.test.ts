import type { IncomingMessage } from 'node:http'
import t from 'tap'
import { requestId } from '../../src/http/lifecycle.js'

/* The request id the service makes when the balancer sent none (docs/api.md): a random version 4 UUID. */

const UUID_V4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/

const withHeader = (value: string | string[] | undefined): IncomingMessage =>
  ({ headers: value === undefined ? {} : { 'x-request-id': value } }) as unknown as IncomingMessage

t.test('made ids are version 4 UUIDs, all different', async t => {
  const ids = Array.from({ length: 3 * 256 + 7 }, () => requestId(withHeader(undefined)))
  const malformed = ids.filter(id => !UUID_V4.test(id))
  t.same(malformed, [], 'every id has the version 4 layout')
  t.equal(new Set(ids).size, ids.length, 'no id repeats')
  // Random, not a counter: the 16 hex digits that are random in every id take every value, in every position.
  for (const position of [0, 9, 15, 24, 35]) {
    t.equal(new Set(ids.map(id => id[position])).size, 16, `position ${position} takes all 16 hex digits`)
  }
})

t.test("the balancer's id is kept when sane, else one is made", async t => {
  t.equal(requestId(withHeader('lb-1234')), 'lb-1234')
  t.match(requestId(withHeader(undefined)), UUID_V4, 'none sent')
  t.match(requestId(withHeader('has space')), UUID_V4, 'not visible ASCII')
  t.match(requestId(withHeader('x'.repeat(129))), UUID_V4, 'longer than 128')
  t.match(requestId(withHeader(['a', 'b'])), UUID_V4, 'not one string')
})
