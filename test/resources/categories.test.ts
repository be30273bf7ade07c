import t from 'tap'
import { testApp, AUTH, json } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

const db = await testDatabase(t)
const { app } = await testApp(t, db.url)

t.test('an empty table lists as []', async t => {
  const res = await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  t.equal(res.statusCode, 200)
  t.equal(res.body, '[]')
  t.match(res.headers['content-type'], /^application\/json; charset=utf-8$/)
  t.equal(res.headers['cache-control'], 'no-cache')
})

t.test('create answers 201 with the stored category and a Location', async t => {
  const res = await app.inject({
    method: 'POST',
    url: '/v1/categories',
    ...json({ name: 'Dogs', description: 'Loyal companions' })
  })
  t.equal(res.statusCode, 201)
  const body = res.json()
  t.same(Object.keys(body).sort(), ['description', 'id', 'name'])
  t.equal(body.name, 'Dogs')
  t.equal(body.description, 'Loyal companions')
  t.type(body.id, 'number')
  t.equal(res.headers.location, `/v1/categories/${body.id}`)
  const got = await app.inject({ method: 'GET', url: res.headers.location as string, headers: AUTH })
  t.equal(got.statusCode, 200)
  t.same(got.json(), body)
})

t.test('description is omitted when it was not given, kept when empty', async t => {
  const bare = await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name: 'Cats' }) })
  t.equal(bare.statusCode, 201)
  t.same(Object.keys(bare.json()).sort(), ['id', 'name'])
  const empty = await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name: 'Fish', description: '' }) })
  t.equal(empty.statusCode, 201)
  t.equal(empty.json().description, '')
})

t.test('the list holds every category, ordered by id', async t => {
  const names = ['b', 'a', 'c', 'a']
  for (const name of names) {
    t.equal((await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name }) })).statusCode, 201)
  }
  const list = (await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })).json() as Array<{
    id: number
    name: string
  }>
  const ids = list.map(c => c.id)
  t.same(
    ids,
    [...ids].sort((a, b) => a - b),
    'ascending ids'
  )
  t.equal(new Set(ids).size, ids.length, 'unique ids')
  t.same(
    list.slice(-4).map(c => c.name),
    names,
    'duplicates are allowed and kept in order'
  )
})

t.test('values round-trip exactly: no trimming, folding or normalisation', async t => {
  const samples = [
    '  padded  ',
    'MiXeD',
    'e\u0301 (decomposed)',
    '\u00e9 (composed)',
    '😀 astral',
    '\u00a0nbsp',
    'tab\tin description only'.replace('\t', ' '),
    'quotes " and \\ backslash',
    '\u2028\u2029 separators',
    '\ufeffbom-like'
  ]
  for (const [i, name] of samples.entries()) {
    const description = `line1\nline2\r\n\ttabbed ${name}`
    const res = await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name, description }) })
    // Messages name the sample by index: a raw U+2028 in a TAP line would break the TAP stream itself.
    t.equal(res.statusCode, 201, `sample ${i}`)
    const got = (
      await app.inject({ method: 'GET', url: `/v1/categories/${res.json().id as number}`, headers: AUTH })
    ).json()
    t.equal(got.name, name, `sample ${i}: name`)
    t.equal(got.description, description, `sample ${i}: description`)
  }
})
