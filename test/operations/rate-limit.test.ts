import t, { type Test } from 'tap'
import { AUTH, OTHER_KEY, TEST_KEY, metric, testApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { freePort } from '../helpers/ports.js'

const db = await testDatabase(t)
const BAD = { authorization: 'Bearer not-a-valid-key' }

function assertRateLimited (
  t: Test,
  res: { statusCode: number; headers: Record<string, unknown>; json: () => unknown },
  policy: string
): void {
  t.equal(res.statusCode, 429)
  const body = res.json() as { code: string; message: string; status: number }
  t.same(Object.keys(body).sort(), ['code', 'message', 'status'])
  t.equal(body.code, 'RATE_LIMITED')
  t.equal(body.status, 429)
  t.match(String(res.headers['retry-after']), /^[1-9][0-9]*$/, 'Retry-After in whole seconds')
  t.match(String(res.headers.ratelimit), new RegExp(`^"${policy}";r=0;t=[1-9][0-9]*$`), 'RateLimit header')
  t.match(
    String(res.headers['ratelimit-policy']),
    new RegExp(`^"${policy}";q=[0-9]+;w=[0-9]+$`),
    'RateLimit-Policy header'
  )
  t.match(res.headers['content-type'], /^application\/json; charset=utf-8$/)
}

t.test('failed authentication: 20 per minute per address by default, then 429 even for a valid key', async t => {
  const { app } = await testApp(t, db.url)
  const from = { remoteAddress: '198.51.100.7' }
  for (let i = 1; i <= 20; i++) {
    const res = await app.inject({ method: 'GET', url: '/v1/categories', headers: i % 2 === 0 ? BAD : {}, ...from })
    t.equal(res.statusCode, 401, `attempt ${i} is a 401`)
  }
  const refused = await app.inject({ method: 'GET', url: '/v1/categories', headers: BAD, ...from })
  assertRateLimited(t, refused, 'auth-failures')
  t.match(refused.headers['ratelimit-policy'], /^"auth-failures";q=20;w=60$/)

  const validFromSameAddress = await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH, ...from })
  assertRateLimited(t, validFromSameAddress, 'auth-failures')
  const postFromSameAddress = await app.inject({
    method: 'POST',
    url: '/v1/categories',
    headers: { ...AUTH, 'content-type': 'application/json' },
    payload: '{"name":"x"}',
    ...from
  })
  t.equal(postFromSameAddress.statusCode, 429, 'the body of a refused request is never read')

  const otherAddress = await app.inject({
    method: 'GET',
    url: '/v1/categories',
    headers: BAD,
    remoteAddress: '198.51.100.8'
  })
  t.equal(otherAddress.statusCode, 401, 'another address is not limited')
  const health = await app.inject({ method: 'GET', url: '/health/live', ...from })
  t.equal(health.statusCode, 200, 'operational endpoints outside /v1 are not limited')
})

t.test('successful requests are not counted', async t => {
  const { app } = await testApp(t, db.url)
  const from = { remoteAddress: '203.0.113.5' }
  for (let i = 0; i < 50; i++) {
    const res = await app.inject({
      method: 'GET',
      url: '/v1/categories',
      headers: { authorization: `Bearer ${i % 2 === 0 ? TEST_KEY : OTHER_KEY}` },
      ...from
    })
    t.equal(res.statusCode, 200)
  }
  for (let i = 0; i < 20; i++) {
    t.equal((await app.inject({ method: 'GET', url: '/v1/nowhere', headers: BAD, ...from })).statusCode, 401)
  }
  t.equal((await app.inject({ method: 'GET', url: '/v1/categories', headers: BAD, ...from })).statusCode, 429)
})

t.test('parallel guesses cannot exceed the limit', async t => {
  const { app } = await testApp(t, db.url, { RATE_LIMIT_AUTH_FAILURES: '5' })
  const responses = await Promise.all(
    Array.from(
      { length: 40 },
      async (_, i) =>
        await app.inject({
          method: 'GET',
          url: '/v1/categories',
          headers: { authorization: `Bearer guess-${i}` },
          remoteAddress: '192.0.2.50'
        })
    )
  )
  const unauthorized = responses.filter(r => r.statusCode === 401).length
  // The in-memory store may refuse a burst early (it reports the counter after the whole burst counted), never late.
  t.ok(unauthorized <= 5, `at most the limit reached auth (${unauthorized})`)
  t.equal(responses.filter(r => r.statusCode === 429).length, 40 - unauthorized, 'every other guess got 429')
})

t.test('TRUST_PROXY: the client address comes from X-Forwarded-For', async t => {
  const { app } = await testApp(t, db.url, {
    TRUST_PROXY: 'true',
    RATE_LIMIT_AUTH_FAILURES: '3',
    RATE_LIMIT_WINDOW_MS: '120000'
  })
  const via = (client: string): Record<string, string> => ({ ...BAD, 'x-forwarded-for': client })
  for (let i = 0; i < 3; i++) {
    t.equal((await app.inject({ method: 'GET', url: '/v1/categories', headers: via('192.0.2.1') })).statusCode, 401)
  }
  const refused = await app.inject({ method: 'GET', url: '/v1/categories', headers: via('192.0.2.1') })
  assertRateLimited(t, refused, 'auth-failures')
  t.match(refused.headers['ratelimit-policy'], /^"auth-failures";q=3;w=120$/)
  t.equal(
    (await app.inject({ method: 'GET', url: '/v1/categories', headers: via('192.0.2.2') })).statusCode,
    401,
    'a different client behind the same proxy is not limited'
  )
  const ipv6 = (await app.inject({ method: 'GET', url: '/v1/categories', headers: via('2001:db8::1') })).statusCode
  t.equal(ipv6, 401)
})

t.test('without TRUST_PROXY, X-Forwarded-For is ignored', async t => {
  const { app } = await testApp(t, db.url, { RATE_LIMIT_AUTH_FAILURES: '2' })
  for (const client of ['192.0.2.1', '192.0.2.2']) {
    t.equal(
      (
        await app.inject({
          method: 'GET',
          url: '/v1/categories',
          headers: { ...BAD, 'x-forwarded-for': client },
          remoteAddress: '10.0.0.1'
        })
      ).statusCode,
      401
    )
  }
  t.equal(
    (
      await app.inject({
        method: 'GET',
        url: '/v1/categories',
        headers: { ...BAD, 'x-forwarded-for': '192.0.2.3' },
        remoteAddress: '10.0.0.1'
      })
    ).statusCode,
    429
  )
})

t.test('the per-key limit is off by default', async t => {
  const { app } = await testApp(t, db.url)
  for (let i = 0; i < 300; i++) {
    const res = await app.inject({ method: 'GET', url: '/v1/store/orders', headers: AUTH })
    t.equal(res.statusCode, 501)
    t.equal(res.headers.ratelimit, undefined)
  }
})

t.test('the per-key limit, when set, counts each key separately by its hash', async t => {
  const { app, logs } = await testApp(t, db.url, { RATE_LIMIT_PER_KEY_PER_MINUTE: '5', LOG_LEVEL: 'debug' })
  for (let i = 1; i <= 5; i++) {
    const res = await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH, remoteAddress: `192.0.2.${i}` })
    t.equal(res.statusCode, 200)
    // t is whole seconds left in the window: 60, or 59 once a second has passed since the window opened (a loaded
    // machine).
    t.match(res.headers.ratelimit, new RegExp(`^"per-key";r=${5 - i};t=(59|60)$`))
    t.equal(res.headers['ratelimit-policy'], '"per-key";q=5;w=60')
  }
  const refused = await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH, remoteAddress: '192.0.2.99' })
  assertRateLimited(t, refused, 'per-key')
  const other = await app.inject({
    method: 'GET',
    url: '/v1/categories',
    headers: { authorization: `bearer ${OTHER_KEY}` }
  })
  t.equal(other.statusCode, 200, 'another key has its own budget')
  t.notOk(
    logs.lines.some(line => line.includes(TEST_KEY)),
    'the key never appears in a log line'
  )
})

t.test(
  'REDIS_URL where nothing answers: the service starts, serves, and keeps per-instance limits (no redis-server needed)',
  async t => {
    // Connections are refused, as when Redis is down.
    const port = await freePort()
    const started = performance.now()
    const { app, logs } = await testApp(t, db.url, {
      REDIS_URL: `redis://user:hunter2@127.0.0.1:${port}/0`,
      RATE_LIMIT_AUTH_FAILURES: '3',
      LOG_LEVEL: 'info'
    })
    t.ok(performance.now() - started < 30000, 'the start does not wait for Redis')
    const from = { remoteAddress: '192.0.2.60' }
    t.equal(
      (await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH, ...from })).statusCode,
      200,
      'a valid key is served'
    )
    for (let i = 0; i < 3; i++) {
      t.equal((await app.inject({ method: 'GET', url: '/v1/categories', headers: BAD, ...from })).statusCode, 401)
    }
    assertRateLimited(
      t,
      await app.inject({ method: 'GET', url: '/v1/categories', headers: BAD, ...from }),
      'auth-failures'
    )
    t.equal(await metric(app, 'rate_limit_redis_up'), 0, 'the gauge says Redis is not in use')
    t.ok((await metric(app, 'rate_limit_redis_fallbacks_total')) >= 5, 'every check fell back')
    const warning = logs.lines.find(line => line.includes('rate limits count per instance'))
    t.match(warning, /"level":40/, 'one warning')
    t.match(warning, new RegExp(`"redis":"127\\.0\\.0\\.1:${port}"`), 'naming the address')
    t.equal(
      logs.lines.filter(line => line.includes('rate limits count per instance')).length,
      1,
      'once, not once a request'
    )
    t.notOk(
      logs.lines.some(line => line.includes('hunter2')),
      'never the password'
    )
  }
)
