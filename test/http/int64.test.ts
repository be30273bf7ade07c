import t from 'tap'
import { testApp, AUTH, json } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { withClient } from '../helpers/pg-client.js'

const db = await testDatabase(t)
const { app } = await testApp(t, db.url)

/** Moves the bigserial sequence so the next id is `next`. */
async function restartSequenceAt (next: string): Promise<void> {
  await withClient(db.url, async client => {
    await client.query(`ALTER SEQUENCE categories_id_seq RESTART WITH ${next}`)
  })
}

// Values around 2^53 (where doubles stop being exact) and up to 2^63-1 (the int8 maximum).
const starts = ['9007199254740991', '9223372036854775800']

for (const start of starts) {
  t.test(`ids from ${start} reach the client as exact JSON integers`, async t => {
    await restartSequenceAt(start)
    const created: string[] = []
    const count = start === '9223372036854775800' ? 8 : 4 // the last one is 9223372036854775807
    for (let i = 0; i < count; i++) {
      const res = await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name: `n${i}` }) })
      t.equal(res.statusCode, 201)
      const expected = (BigInt(start) + BigInt(i)).toString()
      // Compare raw text: JSON.parse would round the number and hide the bug.
      t.match(res.body, new RegExp(`^\\{"id":${expected},"name":"n${i}"\\}$`), `create body has id ${expected}`)
      t.equal(res.headers.location, `/v1/categories/${expected}`)
      created.push(expected)
    }
    const list = await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
    for (const id of created) {
      t.ok(list.body.includes(`{"id":${id},`), `list has exact id ${id}`)
      const one = await app.inject({ method: 'GET', url: `/v1/categories/${id}`, headers: AUTH })
      t.equal(one.statusCode, 200)
      t.match(one.body, new RegExp(`^\\{"id":${id},`), `getCategory returns exact id ${id}`)
    }
  })
}

t.test(
  'after 9223372036854775807 the sequence is exhausted: an Error body, no success, no SQL in the message',
  async t => {
    const res = await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name: 'overflow' }) })
    // nextval() past the maximum is a server-side failure, not the client's fault; it must not be a silent success.
    t.not(res.statusCode, 201)
    t.same(Object.keys(res.json()).sort(), ['code', 'message', 'status'])
    t.notMatch(res.body, /nextval|sequence|categories_id_seq/, 'no SQL internals in the message')
  }
)
