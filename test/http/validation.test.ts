import t, { type Test } from 'tap'
import { testApp, AUTH, json } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

const db = await testDatabase(t)
const { app } = await testApp(t, db.url)

async function post (
  payload: string | Buffer,
  contentType = 'application/json'
): Promise<{ status: number; body: { code: string; message: string; status: number } }> {
  const headers: Record<string, string> = { ...AUTH, 'content-type': contentType }
  const res = await app.inject({ method: 'POST', url: '/v1/categories', headers, payload })
  return { status: res.statusCode, body: res.json() }
}

async function rowCount (): Promise<number> {
  const res = await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  return (res.json() as unknown[]).length
}

/** A 400 with the Error shape, a code, and a message that mentions `mention`. */
function assertRejected (
  t: Test,
  result: Awaited<ReturnType<typeof post>>,
  code: string,
  mention: RegExp,
  label: string
): void {
  t.equal(result.status, 400, `${label}: status`)
  t.same(Object.keys(result.body).sort(), ['code', 'message', 'status'], `${label}: Error shape`)
  t.equal(result.body.code, code, `${label}: code`)
  t.equal(result.body.status, 400, `${label}: status member`)
  t.match(result.body.message, mention, `${label}: message names the problem`)
}

t.test('bodies that break NewCategory are 400 VALIDATION_FAILED naming the field, and store nothing', async t => {
  // Control characters, NUL, whitespace-only names and lone surrogates: each one, in portable-patterns.test.ts.
  const before = await rowCount()
  const cases: Array<[string, unknown, RegExp]> = [
    ['unknown member id', { name: 'a', id: 5 }, /unknown member 'id'/],
    ['misspelt member', { name: 'a', descripton: 'x' }, /unknown member 'descripton'/],
    ['__proto__ member', JSON.parse('{"name":"a","__proto__":{"x":1}}'), /unknown member '__proto__'/],
    ['missing name', { description: 'x' }, /'name'/],
    ['empty object', {}, /'name'/],
    ['name null', { name: null }, /'name' must be of type string/],
    ['description null', { name: 'a', description: null }, /'description' must be of type string/],
    ['name number', { name: 123 }, /'name' must be of type string/],
    ['name true', { name: true }, /'name' must be of type string/],
    ['name array', { name: ['a'] }, /'name' must be of type string/],
    ['name object', { name: { a: 1 } }, /'name' must be of type string/],
    ['description number', { name: 'a', description: 5 }, /'description' must be of type string/],
    ['empty name', { name: '' }, /'name' must be at least 1 character/],
    ['name 256 code points', { name: 'x'.repeat(256) }, /'name' must be at most 255/],
    ['name 256 astral code points', { name: '😀'.repeat(256) }, /'name' must be at most 255/],
    ['description 2001', { name: 'a', description: 'x'.repeat(2001) }, /'description' must be at most 2000/],
    ['body is an array', [{ name: 'a' }], /request body must be a JSON object/],
    ['body is a string', 'Dogs', /request body must be a JSON object/],
    ['body is null', null, /request body must be a JSON object/],
    ['body is a number', 42, /request body must be a JSON object/]
  ]
  for (const [label, body, mention] of cases) {
    assertRejected(t, await post(JSON.stringify(body)), 'VALIDATION_FAILED', mention, label)
  }
  t.equal(await rowCount(), before, 'no row was stored')
})

t.test('invalid UTF-8 bytes are 400 MALFORMED_JSON, never replaced', async t => {
  const bodies: Array<[string, Buffer]> = [
    ['lone continuation byte', Buffer.from([0x7b, 0x22, 0x6e, 0x61, 0x6d, 0x65, 0x22, 0x3a, 0x22, 0x80, 0x22, 0x7d])],
    ['overlong encoding', Buffer.concat([Buffer.from('{"name":"'), Buffer.from([0xc0, 0xaf]), Buffer.from('"}')])],
    [
      'UTF-8 encoded surrogate',
      Buffer.concat([Buffer.from('{"name":"'), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from('"}')])
    ],
    ['truncated sequence', Buffer.concat([Buffer.from('{"name":"'), Buffer.from([0xe2, 0x82]), Buffer.from('"}')])],
    ['latin-1 byte', Buffer.from('{"name":"caf\xe9"}', 'latin1')]
  ]
  for (const [label, body] of bodies) {
    assertRejected(t, await post(body), 'MALFORMED_JSON', /UTF-8/, label)
  }
})

t.test('unparseable or empty JSON is 400 MALFORMED_JSON', async t => {
  for (const raw of ['{', '{"name":"a",}', "{'name':'a'}", 'nul', '{"name":"a"} trailing', '\ufeff{"name":"a"}']) {
    assertRejected(t, await post(raw), 'MALFORMED_JSON', /not valid JSON/, JSON.stringify(raw))
  }
  assertRejected(t, await post(''), 'MALFORMED_JSON', /empty/, 'empty body')
})

t.test('media types: application/json (with utf-8 charset) only', async t => {
  t.equal((await post('{"name":"a"}', 'application/json; charset=utf-8')).status, 201)
  t.equal((await post('{"name":"a"}', 'application/json; charset="UTF-8"')).status, 201)
  t.equal((await post('{"name":"a"}', 'Application/JSON')).status, 201, 'media type names are case-insensitive')
  for (const type of [
    'text/plain',
    'application/x-www-form-urlencoded',
    'application/xml',
    'multipart/form-data; boundary=x',
    'application/json; charset=latin1',
    'application/jsonp',
    'application/merge-patch+json'
  ]) {
    const res = await post('{"name":"a"}', type)
    t.equal(res.status, 415, type)
    t.same(res.body, { code: 'UNSUPPORTED_MEDIA_TYPE', message: res.body.message, status: 415 }, type)
  }
})

t.test('a missing body is 400', async t => {
  const res = await app.inject({ method: 'POST', url: '/v1/categories', headers: AUTH })
  t.equal(res.statusCode, 400)
  t.equal(res.json().status, 400)
  t.match(res.json().code, /^(VALIDATION_FAILED|MALFORMED_JSON)$/)
})

t.test('a request that passes validation is stored exactly (valid neighbours of the rules)', async t => {
  const accepted = [
    { name: 'x'.repeat(255) },
    { name: '😀'.repeat(255) },
    { name: 'a', description: 'x'.repeat(2000) },
    { name: 'a', description: '😀'.repeat(2000) },
    { name: '\ufffe noncharacter and \u200b zero-width' }
  ]
  for (const body of accepted) {
    const res = await app.inject({ method: 'POST', url: '/v1/categories', ...json(body) })
    t.equal(res.statusCode, 201, JSON.stringify(body).slice(0, 40))
    const { id, ...rest } = res.json()
    t.same(rest, body)
    t.type(id, 'number')
  }
  const pair = await app.inject({
    method: 'POST',
    url: '/v1/categories',
    headers: { ...AUTH, 'content-type': 'application/json' },
    payload: '{"name":"\\ud83d\\ude00"}'
  })
  t.equal(pair.statusCode, 201, 'an escaped valid surrogate pair is one code point and accepted')
  t.equal(pair.json().name, '😀')
})
