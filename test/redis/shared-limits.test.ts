import { createHash } from 'node:crypto'
import type { FastifyInstance } from 'fastify'
import t, { type Test } from 'tap'
import { AUTH, OTHER_KEY, TEST_KEY, metric, testApp, until } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { testRedis, type TestRedis } from '../helpers/redis.js'

/*
 * With REDIS_URL, both rate limits count in one real Redis shared by several
 * instances (here: several apps in one process, each with its own client);
 * when Redis stops or hangs, each instance falls back to its own counters and
 * comes back without a restart. Run by `npm run test:redis` (needs redis-server).
 */

const db = await testDatabase(t)
const BAD = { authorization: 'Bearer not-a-valid-key' }

type Instance = Awaited<ReturnType<typeof testApp>>

async function instances (
  t: Test,
  redis: TestRedis,
  count: number,
  env: Record<string, string> = {}
): Promise<Instance[]> {
  const apps = []
  for (let i = 0; i < count; i++) {
    apps.push(await testApp(t, db.url, { REDIS_URL: redis.url, LOG_LEVEL: 'info', ...env }))
  }
  return apps
}

async function get (
  app: FastifyInstance,
  headers: Record<string, string>,
  remoteAddress: string,
  url = '/v1/categories'
): Promise<number> {
  return (await app.inject({ method: 'GET', url, headers, remoteAddress })).statusCode
}

/** One assertion: `check` comes to hold within `limitMs`. */
async function eventually (t: Test, what: string, check: () => Promise<boolean>, limitMs = 10000): Promise<void> {
  await t.resolves(until(what, check, limitMs, 100), what)
}

t.test('three instances share the failed-authentication limit: the 21st attempt is refused by each', async t => {
  const redis = await testRedis(t)
  const apps = (await instances(t, redis, 3)).map(i => i.app)
  const from = '198.51.100.7'
  for (let i = 0; i < 20; i++) {
    t.equal(await get(apps[i % 3] as FastifyInstance, BAD, from), 401, `attempt ${i + 1} on instance ${(i % 3) + 1}`)
  }
  for (const [i, app] of apps.entries()) {
    t.equal(await get(app, BAD, from), 429, `attempt 21+ on instance ${i + 1}`)
    t.equal(await get(app, AUTH, from), 429, `a valid key from the same address on instance ${i + 1}`)
    t.equal(await get(app, BAD, '198.51.100.8'), 401, `another address on instance ${i + 1}`)
  }
  t.equal(
    await metric(apps[0] as FastifyInstance, 'rate_limit_redis_fallbacks_total'),
    0,
    'no check fell back to per-instance counters'
  )
  t.equal(await metric(apps[0] as FastifyInstance, 'rate_limit_redis_up'), 1)
})

t.test('a parallel burst spread over three instances gets exactly the limit through', async t => {
  const redis = await testRedis(t)
  const apps = (await instances(t, redis, 3, { RATE_LIMIT_AUTH_FAILURES: '10' })).map(i => i.app)
  const statuses = await Promise.all(
    Array.from(
      { length: 90 },
      async (_, i) => await get(apps[i % 3] as FastifyInstance, { authorization: `Bearer guess-${i}` }, '192.0.2.50')
    )
  )
  t.equal(statuses.filter(s => s === 401).length, 10, 'exactly 10 reached the key check')
  t.equal(statuses.filter(s => s === 429).length, 80, 'every other guess got 429')
})

t.test('the per-key limit is shared too', async t => {
  const redis = await testRedis(t)
  const [a, b] = (await instances(t, redis, 2, { RATE_LIMIT_PER_KEY_PER_MINUTE: '6' })).map(i => i.app) as [
    FastifyInstance,
    FastifyInstance
  ]
  for (let i = 0; i < 6; i++) {
    const res = await (i % 2 === 0 ? a : b).inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
    t.equal(res.statusCode, 200)
    t.match(res.headers.ratelimit, new RegExp(`^"per-key";r=${5 - i};t=`), 'RateLimit counts across both instances')
  }
  t.equal((await a.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })).statusCode, 429)
  t.equal((await b.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })).statusCode, 429)
  t.equal(
    (await b.inject({ method: 'GET', url: '/v1/categories', headers: { authorization: `Bearer ${OTHER_KEY}` } }))
      .statusCode,
    200,
    'the other key has its own budget'
  )
})

t.test('Redis holds no API key and no digest API_KEY_SHA256 would accept; addresses honour TRUST_PROXY', async t => {
  const redis = await testRedis(t)
  const [{ app: direct }] = (await instances(t, redis, 1, { RATE_LIMIT_PER_KEY_PER_MINUTE: '100' })) as [Instance]
  const [{ app: proxied }] = (await instances(t, redis, 1, {
    RATE_LIMIT_PER_KEY_PER_MINUTE: '100',
    TRUST_PROXY: 'true'
  })) as [Instance]
  await get(direct, AUTH, '203.0.113.9')
  await get(direct, { authorization: `Bearer ${OTHER_KEY}` }, '203.0.113.9')
  await get(direct, { ...BAD, 'x-forwarded-for': '192.0.2.77' }, '203.0.113.9')
  await get(proxied, { ...BAD, 'x-forwarded-for': '192.0.2.1' }, '10.0.0.1')
  await get(proxied, { ...BAD, 'x-forwarded-for': '2001:db8:1:2::1' }, '10.0.0.1')
  await get(proxied, { ...BAD, 'x-forwarded-for': '2001:db8:1:2::ffff' }, '10.0.0.1')

  const keys = (await redis.client().keys('*')).sort()
  t.same(
    keys.filter(k => k.includes('auth-failures')),
    [
      'petstore:rate-limit:auth-failures:192.0.2.1',
      'petstore:rate-limit:auth-failures:2001:db8:1:2::',
      'petstore:rate-limit:auth-failures:203.0.113.9'
    ],
    'by the peer without TRUST_PROXY (never 192.0.2.77), by X-Forwarded-For with it (never the proxy 10.0.0.1), ' +
      'IPv6 by /64'
  )
  const perKey = keys.filter(k => k.includes('per-key'))
  t.equal(perKey.length, 2, 'one per-key counter per key')
  for (const secret of [TEST_KEY, OTHER_KEY]) {
    const digest = createHash('sha256').update(secret).digest()
    for (const form of [secret, digest.toString('hex'), digest.toString('base64'), digest.toString('base64url')]) {
      t.notOk(
        keys.some(k => k.toLowerCase().includes(form.toLowerCase())),
        'no key holds the API key or its SHA-256'
      )
    }
  }
  t.ok(
    keys.every(k => k.startsWith('petstore:rate-limit:')),
    'every key under one prefix'
  )
})

t.test('every counter in Redis expires with its window, even one left without an expiry', async t => {
  const redis = await testRedis(t)
  const [{ app }] = (await instances(t, redis, 1, { RATE_LIMIT_WINDOW_MS: '120000' })) as [Instance]
  const client = redis.client()
  t.equal(await get(app, BAD, '192.0.2.70'), 401)
  const ttl = await client.pttl('petstore:rate-limit:auth-failures:192.0.2.70')
  t.ok(ttl > 110000 && ttl <= 120000, `the first failure opens a window of RATE_LIMIT_WINDOW_MS (${ttl} ms left)`)
  // A counter without an expiry would refuse its address forever; the next hit gives it the window.
  await client.set('petstore:rate-limit:auth-failures:192.0.2.71', '100')
  t.equal(await get(app, BAD, '192.0.2.71'), 429, 'counted on the stray counter')
  const healed = await client.pttl('petstore:rate-limit:auth-failures:192.0.2.71')
  t.ok(healed > 110000 && healed <= 120000, `and it expires with the window (${healed} ms left)`)
})

t.test('Redis stopped: per-instance limits, a warning and a metric; Redis back: shared again, no restart', async t => {
  const password = 's3cret-pa55word'
  const redis = await testRedis(t, { password })
  const [one, two] = (await instances(t, redis, 2, { RATE_LIMIT_AUTH_FAILURES: '3', LOG_LEVEL: 'trace' })) as [
    Instance,
    Instance
  ]
  const { app: a } = one
  const { app: b } = two
  await redis.stop()
  await eventually(t, 'the gauge says per instance', async () => (await metric(a, 'rate_limit_redis_up')) === 0)
  t.equal(await get(a, AUTH, '192.0.2.10'), 200, 'a valid key is served')
  // Per instance now: each instance allows 3 failures from the address, not 3 in all.
  for (const app of [a, b]) {
    for (let i = 0; i < 3; i++) t.equal(await get(app, BAD, '192.0.2.10'), 401)
    t.equal(await get(app, BAD, '192.0.2.10'), 429, 'the per-instance limit still holds')
  }
  t.ok((await metric(a, 'rate_limit_redis_fallbacks_total')) >= 4, 'fallbacks are counted')
  t.ok(
    one.logs.lines.some(line => /"level":40/.test(line) && line.includes('rate limits count per instance')),
    'a warning says so'
  )

  await redis.start()
  await eventually(t, 'back on Redis', async () => {
    await get(a, AUTH, '192.0.2.99')
    return (await metric(a, 'rate_limit_redis_up')) === 1
  })
  await eventually(t, 'both instances back on Redis', async () => {
    await get(b, AUTH, '192.0.2.99')
    return (await metric(b, 'rate_limit_redis_up')) === 1
  })
  for (let i = 0; i < 3; i++) t.equal(await get(i % 2 === 0 ? a : b, BAD, '192.0.2.20'), 401)
  t.equal(await get(b, BAD, '192.0.2.20'), 429, 'shared again: the 4th attempt over both is refused')
  t.ok(
    one.logs.lines.some(line => line.includes('Redis answers again')),
    'the recovery is logged'
  )
  const all = [...one.logs.lines, ...two.logs.lines]
  t.ok(all.length > 0)
  t.notOk(
    all.some(line => line.includes(password)),
    'the password in REDIS_URL is never logged'
  )
  t.notOk(
    all.some(line => line.includes(redis.url)),
    'nor the URL'
  )
})

t.test(
  'Redis hung: a request waits at most REDIS_TIMEOUT_MS, later ones not at all, until it answers again',
  async t => {
    const redis = await testRedis(t)
    const [{ app }] = (await instances(t, redis, 1, { REDIS_TIMEOUT_MS: '300', RATE_LIMIT_AUTH_FAILURES: '3' })) as [
      Instance
    ]
    redis.pause()
    t.teardown(() => {
      redis.resume()
    })
    const started = performance.now()
    t.equal(await get(app, AUTH, '192.0.2.30'), 200, 'served while Redis hangs')
    const first = performance.now() - started
    t.ok(first < 5000, `the first request did not hang (${Math.round(first)} ms)`)
    t.equal(await metric(app, 'rate_limit_redis_up'), 0)
    for (let i = 0; i < 3; i++) t.equal(await get(app, BAD, '192.0.2.30'), 401)
    t.equal(await get(app, BAD, '192.0.2.30'), 429, 'per instance while Redis hangs')
    redis.resume()
    await eventually(t, 'back on Redis once it answers', async () => {
      await get(app, AUTH, '192.0.2.31')
      return (await metric(app, 'rate_limit_redis_up')) === 1
    })
  }
)

t.test('a wrong password: the service starts, counts per instance, says why, and never logs the password', async t => {
  const redis = await testRedis(t, { password: 'right-password' })
  const url = redis.url.replace('right-password', 'wrong-password')
  const started = performance.now()
  const { app, logs } = await testApp(t, db.url, { REDIS_URL: url, LOG_LEVEL: 'trace' })
  t.ok(performance.now() - started < 30000, 'the start did not hang')
  t.equal(await get(app, AUTH, '192.0.2.40'), 200)
  t.equal(await metric(app, 'rate_limit_redis_up'), 0)
  const warning = logs.lines.find(line => line.includes('rate limits count per instance'))
  t.match(warning, /WRONGPASS|NOAUTH|invalid/i, 'the warning gives the reason')
  t.notOk(
    logs.lines.some(line => line.includes('wrong-password') || line.includes('right-password')),
    'no password in any log line'
  )
})
