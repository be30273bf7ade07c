import { createHash } from 'node:crypto'
import { Agent, request } from 'node:http'
import t from 'tap'
import { listeningApp, testApp, AUTH, OTHER_KEY, TEST_KEY } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

const db = await testDatabase(t)
// These tests send far more than 20 unauthenticated requests from one address; the failed-auth limit is tested in
// rate-limit.test.ts.
const { app, logs } = await testApp(t, db.url, { LOG_LEVEL: 'trace', RATE_LIMIT_AUTH_FAILURES: '1000000' })

const CHALLENGE = 'Bearer realm="petstore"'
const INVALID = 'Bearer realm="petstore", error="invalid_token"'

async function get (
  url: string,
  headers: Record<string, string> = {}
): Promise<{ status: number; body: any; challenge: string | undefined }> {
  const res = await app.inject({ method: 'GET', url, headers })
  return { status: res.statusCode, body: res.json(), challenge: res.headers['www-authenticate'] as string | undefined }
}

t.test('every /v1 path, known or not, is 401 without a key', async t => {
  for (const url of [
    '/v1/categories',
    '/v1/categories/1',
    '/v1/categories/abc',
    '/v1/pets/1',
    '/v1/store/orders',
    '/v1/nope',
    '/v1',
    '/v1/',
    '/v1?x=1'
  ]) {
    const res = await get(url)
    t.equal(res.status, 401, url)
    t.same(res.body, { code: 'UNAUTHORIZED', message: res.body.message, status: 401 }, url)
    t.equal(res.challenge, CHALLENGE, url)
  }
})

t.test('wrong, malformed or misplaced credentials are 401', async t => {
  const cases: Array<[Record<string, string>, string]> = [
    [{ authorization: 'Bearer wrong-key' }, INVALID],
    [{ authorization: `Bearer ${TEST_KEY}x` }, INVALID],
    [{ authorization: `Bearer ${TEST_KEY.slice(0, -1)}` }, INVALID],
    [{ authorization: `Basic ${Buffer.from(`u:${TEST_KEY}`).toString('base64')}` }, CHALLENGE],
    [{ authorization: TEST_KEY }, CHALLENGE],
    [{ authorization: 'Bearer' }, CHALLENGE],
    [{ authorization: 'Bearer ' }, CHALLENGE],
    [{ authorization: '' }, CHALLENGE],
    [{ 'x-api-key': TEST_KEY }, CHALLENGE]
  ]
  for (const [headers, challenge] of cases) {
    const res = await get('/v1/categories', headers)
    t.equal(res.status, 401, JSON.stringify(headers))
    t.equal(res.body.code, 'UNAUTHORIZED')
    t.equal(res.challenge, challenge, JSON.stringify(headers))
  }
  const query = await get(`/v1/categories?api_key=${TEST_KEY}&access_token=${TEST_KEY}`)
  t.equal(query.status, 401, 'keys are never accepted from the query string')
})

t.test('the scheme name is case-insensitive and every configured key works', async t => {
  for (const scheme of ['Bearer', 'bearer', 'BEARER', 'bEaReR']) {
    t.equal((await get('/v1/categories', { authorization: `${scheme} ${TEST_KEY}` })).status, 200, scheme)
  }
  t.equal((await get('/v1/categories', { authorization: `Bearer ${OTHER_KEY}` })).status, 200, 'second key (rotation)')
})

t.test('the key is checked before the body is read, parsed or validated', async t => {
  for (const [type, payload] of [
    ['application/json', '{not json'],
    ['text/plain', 'x'],
    ['application/json', JSON.stringify({ name: 'x'.repeat(100000) })]
  ]) {
    const res = await app.inject({
      method: 'POST',
      url: '/v1/categories',
      headers: { 'content-type': type as string },
      payload
    })
    t.equal(res.statusCode, 401, `${type}: 401, not 400/413/415`)
  }
  const wrongMethod = await app.inject({ method: 'DELETE', url: '/v1/categories' })
  t.equal(wrongMethod.statusCode, 401, '405 only after auth')
})

t.test('operational endpoints need no key', async t => {
  for (const url of ['/health/live', '/health/ready', '/docs/openapi.json']) {
    t.equal((await app.inject({ method: 'GET', url })).statusCode, 200, url)
  }
  const docs = await app.inject({ method: 'GET', url: '/docs' })
  t.ok(docs.statusCode === 200 || docs.statusCode === 302, '/docs answers without a key')
})

t.test('API_KEY_SHA256: a deployment can hold digests instead of keys', async t => {
  const digest = createHash('sha256').update('hashed-only-key').digest('hex')
  const { app: hashedApp } = await testApp(t, await db.createDatabase(), {
    API_KEYS: 'plain-key',
    API_KEY_SHA256: `${'0'.repeat(64)},${digest.toUpperCase()}`
  })
  const ok = await hashedApp.inject({
    method: 'GET',
    url: '/v1/categories',
    headers: { authorization: 'Bearer hashed-only-key' }
  })
  t.equal(ok.statusCode, 200, 'key matched by its digest')
  const plain = await hashedApp.inject({
    method: 'GET',
    url: '/v1/categories',
    headers: { authorization: 'Bearer plain-key' }
  })
  t.equal(plain.statusCode, 200, 'plain keys still work beside digests')
  const digestAsKey = await hashedApp.inject({
    method: 'GET',
    url: '/v1/categories',
    headers: { authorization: `Bearer ${digest}` }
  })
  t.equal(digestAsKey.statusCode, 401, 'the digest itself is not a key')
})

t.test('no key, digest or Authorization header appears in any log line', async t => {
  logs.lines.length = 0
  await get('/v1/categories', AUTH)
  await get('/v1/categories', { authorization: 'Bearer leaked-wrong-key-123' })
  await get(`/v1/categories?api_key=${TEST_KEY}`)
  await app.inject({
    method: 'POST',
    url: '/v1/categories',
    headers: { ...AUTH, 'content-type': 'application/json' },
    payload: '{bad'
  })
  t.ok(logs.lines.length >= 4, `captured ${logs.lines.length} log lines at trace level`)
  const digest = createHash('sha256').update(TEST_KEY).digest('hex')
  for (const line of logs.lines) {
    t.notMatch(line, TEST_KEY, 'no key')
    t.notMatch(line, 'leaked-wrong-key-123', 'no wrong key either')
    t.notMatch(line, digest, 'no digest')
    t.notMatch(line.toLowerCase(), /"authorization"\s*:\s*"bearer/, 'no Authorization header')
  }
})

t.test('one keep-alive connection: every request is checked, whatever the connection sent before', async t => {
  const { port } = await listeningApp(t, await db.createDatabase(), { RATE_LIMIT_AUTH_FAILURES: '4' })
  const agent = new Agent({ keepAlive: true, maxSockets: 1 })
  t.teardown(() => {
    agent.destroy()
  })
  const sockets = new Set<unknown>()
  const status = async (authorization?: string): Promise<number> =>
    await new Promise((resolve, reject) => {
      const req = request(
        {
          host: '127.0.0.1',
          port,
          path: '/v1/categories',
          agent,
          headers: authorization === undefined ? {} : { authorization }
        },
        res => {
          sockets.add(req.socket)
          res.resume()
          res.on('end', () => {
            resolve(res.statusCode ?? 0)
          })
        }
      )
      req.on('error', reject)
      req.end()
    })
  t.equal(await status(AUTH.authorization), 200, 'a valid key')
  t.equal(await status(AUTH.authorization), 200, 'the same header again')
  t.equal(await status(`Bearer ${TEST_KEY}x`), 401, 'a longer key after a valid one')
  t.equal(await status(`Bearer ${TEST_KEY.slice(0, -1)}`), 401, 'a shorter one')
  t.equal(await status(), 401, 'no header after a valid one')
  t.equal(await status(`Bearer ${OTHER_KEY}`), 200, 'another valid key')
  t.equal(await status(`bearer ${TEST_KEY}`), 200, 'the first key again, another spelling')
  t.equal(await status(`Bearer ${TEST_KEY.replace(/.$/, 'x')}`), 401, 'the fourth failure reaches the limit of 4')
  t.equal(await status(AUTH.authorization), 429, 'and a header this connection already proved is refused too')
  t.equal(sockets.size, 1, 'all on one connection')
})
