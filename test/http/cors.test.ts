import t, { type Test } from 'tap'
import { ConfigError, loadConfig } from '../../src/config.js'
import { CORS_METHODS } from '../../src/http/cors.js'
import { AUTH, json, testApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

/*
 * CORS_ORIGINS: pages on those origins may call the API. Preflights (sent by the
 * browser without a key) are answered before auth and never count toward a rate
 * limit; every response to an allowed origin, errors included, carries the CORS
 * headers. Headless Chromium checks the same from real pages (test/browser/cors.browser.ts).
 */

const PAGE = 'https://app.example.com'
const OTHER_PAGE = 'https://evil.example.net'
const db = await testDatabase(t)
const { app } = await testApp(t, db.url, { CORS_ORIGINS: `${PAGE}, http://127.0.0.1:8080`, PETS_SUNSET: '2027-06-30' })

const preflight = (
  origin: string,
  remoteAddress: string,
  url = '/v1/categories',
  method = 'POST'
): Promise<Awaited<ReturnType<typeof app.inject>>> =>
  app.inject({
    method: 'OPTIONS',
    url,
    remoteAddress,
    headers: {
      origin,
      'access-control-request-method': method,
      'access-control-request-headers': 'authorization,content-type,idempotency-key'
    }
  })

const corsHeaderNames = (headers: Record<string, unknown>): string[] =>
  Object.keys(headers).filter(h => h.startsWith('access-control-'))

function hasVaryOrigin (t: Test, headers: Record<string, unknown>, what: string): void {
  t.match(String(headers.vary), /(^|,\s*)Origin(,|$)/i, `${what}: Vary names Origin`)
}

t.test('a preflight from an allowed origin: 204 before auth, with what the page may send', async t => {
  const res = await preflight(PAGE, '192.0.2.1')
  t.equal(res.statusCode, 204)
  t.equal(res.body, '')
  t.equal(res.headers['access-control-allow-origin'], PAGE)
  t.equal(res.headers['access-control-allow-methods'], 'GET, HEAD, POST, PATCH, DELETE')
  t.same(String(res.headers['access-control-allow-headers']).split(', ').sort(), [
    'Authorization',
    'Content-Type',
    'Idempotency-Key',
    'If-Match',
    'If-None-Match',
    'X-Request-Id'
  ])
  t.equal(res.headers['access-control-max-age'], '600')
  t.equal(res.headers['access-control-allow-credentials'], undefined, 'keys travel in Authorization, not cookies')
  t.equal(res.headers['www-authenticate'], undefined, 'not a 401')
  hasVaryOrigin(t, res.headers, 'preflight')
  t.equal(
    (await preflight('http://127.0.0.1:8080', '192.0.2.1')).headers['access-control-allow-origin'],
    'http://127.0.0.1:8080',
    'every configured origin'
  )
  t.equal(
    (await preflight(PAGE, '192.0.2.1', '/v1/nope', 'GET')).statusCode,
    204,
    'any path: the actual request gets the 404'
  )
})

t.test(
  'a preflight from another origin: 204 with no Access-Control-Allow-* (the browser blocks), not a 401',
  async t => {
    for (const origin of [OTHER_PAGE, 'https://app.example.com:8443', 'http://app.example.com', 'null']) {
      const res = await preflight(origin, '192.0.2.2')
      t.equal(res.statusCode, 204, origin)
      t.same(corsHeaderNames(res.headers), [], `${origin}: no CORS headers`)
      t.equal(res.headers['www-authenticate'], undefined)
    }
  }
)

t.test('preflights never count as failed authentications, from either kind of origin', async t => {
  const address = '198.51.100.20'
  for (let i = 0; i < 25; i++) {
    t.equal((await preflight(PAGE, address)).statusCode, 204)
    t.equal((await preflight(OTHER_PAGE, address)).statusCode, 204)
  }
  // The address's whole failed-authentication budget (20) is still there.
  for (let i = 1; i <= 20; i++) {
    const res = await app.inject({
      method: 'GET',
      url: '/v1/categories',
      remoteAddress: address,
      headers: { origin: PAGE }
    })
    t.equal(res.statusCode, 401, `failure ${i} is answered 401`)
  }
  const refused = await app.inject({
    method: 'GET',
    url: '/v1/categories',
    remoteAddress: address,
    headers: { origin: PAGE }
  })
  t.equal(refused.statusCode, 429, 'the 21st failure is the first refused')
  t.equal(refused.headers['access-control-allow-origin'], PAGE, 'the 429 is readable by the page')
  t.equal(JSON.parse(refused.body).code, 'RATE_LIMITED')
})

t.test("nor toward a key's limit", async t => {
  const { app: limited } = await testApp(t, db.url, { CORS_ORIGINS: PAGE, RATE_LIMIT_PER_KEY_PER_MINUTE: '2' })
  for (let i = 0; i < 25; i++) {
    const res = await limited.inject({
      method: 'OPTIONS',
      url: '/v1/categories',
      headers: {
        origin: PAGE,
        'access-control-request-method': 'GET',
        'access-control-request-headers': 'authorization'
      }
    })
    t.equal(res.statusCode, 204)
  }
  const first = await limited.inject({ method: 'GET', url: '/v1/categories', headers: { ...AUTH, origin: PAGE } })
  t.equal(first.statusCode, 200)
  t.match(first.headers.ratelimit, /^"per-key";r=1;/, 'the first counted request')
  t.match(first.headers['access-control-expose-headers'], /RateLimit, RateLimit-Policy/)
})

t.test('actual responses: the origin, the exposed headers and Vary: Origin', async t => {
  const created = await app.inject({
    method: 'POST',
    url: '/v1/categories',
    ...json({ name: 'cors-created' }),
    headers: { ...json({}).headers, origin: PAGE, 'idempotency-key': 'cors-1' }
  })
  t.equal(created.statusCode, 201)
  t.equal(created.headers['access-control-allow-origin'], PAGE)
  t.same(String(created.headers['access-control-expose-headers']).split(', '), [
    'ETag',
    'Link',
    'Location',
    'Retry-After',
    'RateLimit',
    'RateLimit-Policy',
    'X-Request-Id',
    'Deprecation',
    'Sunset'
  ])
  t.ok(created.headers.location)
  hasVaryOrigin(t, created.headers, 'POST')
  const list = await app.inject({ method: 'GET', url: '/v1/categories', headers: { ...AUTH, origin: PAGE } })
  t.equal(list.statusCode, 200)
  t.equal(list.headers['access-control-allow-origin'], PAGE)
  t.ok(list.headers.etag)
  hasVaryOrigin(t, list.headers, 'the cached list')
  const notModified = await app.inject({
    method: 'GET',
    url: '/v1/categories',
    headers: { ...AUTH, origin: PAGE, 'if-none-match': String(list.headers.etag) }
  })
  t.equal(notModified.statusCode, 304)
  t.equal(notModified.headers['access-control-allow-origin'], PAGE, '304 too')
  const other = await app.inject({ method: 'GET', url: '/v1/categories', headers: { ...AUTH, origin: OTHER_PAGE } })
  t.equal(other.statusCode, 200, 'another origin is served (CORS is enforced by the browser)')
  t.same(corsHeaderNames(other.headers), [], 'but gets no CORS headers')
  hasVaryOrigin(t, other.headers, 'another origin')
})

t.test('errors carry the CORS headers, so a page can read the Error body', async t => {
  const cases: Array<[string, string, Record<string, string>, number]> = [
    ['GET', '/v1/categories', {}, 401],
    ['GET', '/v1/nope', AUTH, 404],
    ['DELETE', '/v1/categories', AUTH, 405],
    ['GET', '/v1/pets/1', AUTH, 501]
  ]
  for (const [method, url, headers, status] of cases) {
    const res = await app.inject({
      method: method as 'GET',
      url,
      headers: { ...headers, origin: PAGE },
      remoteAddress: '192.0.2.30'
    })
    t.equal(res.statusCode, status, `${method} ${url}`)
    t.equal(res.headers['access-control-allow-origin'], PAGE, `${status}: Access-Control-Allow-Origin`)
    t.match(
      res.headers['access-control-expose-headers'],
      /Deprecation, Sunset/,
      `${status}: Access-Control-Expose-Headers`
    )
    t.equal(JSON.parse(res.body).status, status)
  }
  const bad = await app.inject({
    method: 'POST',
    url: '/v1/categories',
    headers: { ...AUTH, origin: PAGE, 'content-type': 'application/json' },
    payload: '{"name":'
  })
  t.equal(bad.statusCode, 400)
  t.equal(bad.headers['access-control-allow-origin'], PAGE, '400: Access-Control-Allow-Origin')
})

t.test('OPTIONS that is not a preflight is what it was: 405 on a known path with a key, 401 without', async t => {
  const withKey = await app.inject({ method: 'OPTIONS', url: '/v1/categories', headers: AUTH })
  t.equal(withKey.statusCode, 405)
  t.equal(withKey.headers.allow, 'GET, POST, HEAD')
  t.equal((await app.inject({ method: 'OPTIONS', url: '/v1/nope', headers: AUTH })).statusCode, 404)
  t.equal((await app.inject({ method: 'OPTIONS', url: '/v1/categories', remoteAddress: '192.0.2.40' })).statusCode, 401)
})

t.test('the allowed methods are every method a route under /v1 answers', async t => {
  // The published document: every operation under /v1 (its paths are relative to a server ending in /v1).
  const paths = (app.swagger() as { paths: Record<string, Record<string, unknown>> }).paths
  const methods = new Set(Object.values(paths).flatMap(operations => Object.keys(operations).map(m => m.toUpperCase())))
  t.ok(methods.size > 0)
  for (const method of methods) t.ok(CORS_METHODS.includes(method), `${method} is allowed`)
})

t.test('without CORS_ORIGINS there are no CORS headers at all', async t => {
  const { app: plain } = await testApp(t, db.url)
  const res = await plain.inject({ method: 'GET', url: '/v1/categories', headers: { ...AUTH, origin: PAGE } })
  t.same(corsHeaderNames(res.headers), [])
  t.notMatch(String(res.headers.vary ?? ''), /Origin/i)
})

t.test('CORS_ORIGINS must be exact origins', async t => {
  t.same(loadConfig({ CORS_ORIGINS: 'https://a.example, http://localhost:5173' }).corsOrigins, [
    'https://a.example',
    'http://localhost:5173'
  ])
  t.same(loadConfig({}).corsOrigins, [])
  for (const bad of [
    '*',
    'app.example.com',
    'https://app.example.com/',
    'https://app.example.com/path',
    'https://App.example.com',
    'https://app.example.com:443',
    'ftp://files.example',
    'https://a.example,,https://b.example',
    'null'
  ]) {
    t.throws(() => loadConfig({ CORS_ORIGINS: bad }), ConfigError, bad)
    t.throws(() => loadConfig({ CORS_ORIGINS: bad }), /^CORS_ORIGINS entry \d+ /, bad)
  }
  t.throws(() => loadConfig({ CORS_ORIGINS: 'https://App.example.com' }), /did you mean https:\/\/app\.example\.com\?/)
  t.throws(
    () => loadConfig({ CORS_ORIGINS: 'https://app.example.com/' }),
    /^CORS_ORIGINS entry 1 \("https:\/\/app\.example\.com\/"\) is not an origin/,
    'the entry is named by its place and its value'
  )
})
