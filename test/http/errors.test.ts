import t, { type Test } from 'tap'
import pg from 'pg'
import { testApp, AUTH, json, until } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

const db = await testDatabase(t)
const { app } = await testApp(t, db.url, { PETS_SUNSET: '2027-06-30' })

function assertErrorBody (
  t: Test,
  res: { statusCode: number; headers: Record<string, unknown>; body: string },
  status: number,
  code: string
): void {
  t.equal(res.statusCode, status, `${code}: status`)
  t.match(String(res.headers['content-type']), /^application\/json; charset=utf-8$/, `${code}: media type`)
  const body = JSON.parse(res.body)
  t.same(Object.keys(body).sort(), ['code', 'message', 'status'], `${code}: exactly code, message, status`)
  t.equal(body.code, code)
  t.equal(body.status, status)
  t.type(body.message, 'string')
}

t.test('unknown paths are 404 NOT_FOUND (after auth under /v1)', async t => {
  for (const url of ['/v1/nope', '/v1/categories/1/extra', '/V1/categories', '/nope', '/v2/categories']) {
    assertErrorBody(t, await app.inject({ method: 'GET', url, headers: AUTH }), 404, 'NOT_FOUND')
  }
})

t.test('placeholders answer 501 NOT_IMPLEMENTED; pets is deprecated with a sunset', async t => {
  const pets = await app.inject({ method: 'GET', url: '/v1/pets/42', headers: AUTH })
  assertErrorBody(t, pets, 501, 'NOT_IMPLEMENTED')
  t.equal(pets.headers.deprecation, 'true')
  t.equal(pets.headers.sunset, 'Wed, 30 Jun 2027 00:00:00 GMT')
  const orders = await app.inject({ method: 'GET', url: '/v1/store/orders', headers: AUTH })
  assertErrorBody(t, orders, 501, 'NOT_IMPLEMENTED')
  t.equal(orders.headers.deprecation, undefined)
})

t.test('without PETS_SUNSET there is no Sunset header', async t => {
  const { app: plain } = await testApp(t, db.url)
  const res = await plain.inject({ method: 'GET', url: '/v1/pets/42', headers: AUTH })
  t.equal(res.headers.deprecation, 'true')
  t.equal(res.headers.sunset, undefined)
})

t.test('every response carries a request id; a sane X-Request-Id from the balancer is kept', async t => {
  const own = await app.inject({ method: 'GET', url: '/v1/nope' })
  t.match(String(own.headers['x-request-id']), /^[0-9a-f-]{36}$/)
  const kept = await app.inject({
    method: 'GET',
    url: '/v1/categories',
    headers: { ...AUTH, 'x-request-id': 'lb-1234' }
  })
  t.equal(kept.headers['x-request-id'], 'lb-1234')
  const insane = await app.inject({
    method: 'GET',
    url: '/v1/categories',
    headers: { ...AUTH, 'x-request-id': 'x'.repeat(300) }
  })
  t.not(insane.headers['x-request-id'], 'x'.repeat(300), 'an oversized id is replaced')
  // The 401 of the auth hook, a validation 400, a 404 after auth, a 405 and a 304 without a body: each has its id too.
  const etag = String(kept.headers.etag)
  const others = [
    { method: 'GET', url: '/v1/categories' },
    {
      method: 'POST',
      url: '/v1/categories',
      headers: { ...AUTH, 'content-type': 'application/json' },
      payload: '{"name":1}'
    },
    { method: 'GET', url: '/v1/nope', headers: AUTH },
    { method: 'DELETE', url: '/v1/categories', headers: AUTH },
    { method: 'GET', url: '/v1/categories', headers: { ...AUTH, 'if-none-match': etag } }
  ] as const
  for (const [i, request] of others.entries()) {
    const res = await app.inject({
      ...request,
      headers: { ...('headers' in request ? request.headers : {}), 'x-request-id': `other-${i}` }
    })
    t.equal(
      res.headers['x-request-id'],
      `other-${i}`,
      `${request.method} ${request.url} answered ${res.statusCode} with its request id`
    )
  }
})

t.test('a bug is a 500 with a generic message, no internals', async t => {
  const bugDb = await db.createDatabase()
  const { app: broken } = await testApp(t, bugDb)
  const admin = new pg.Client({ connectionString: bugDb })
  await admin.connect()
  await admin.query('DROP TABLE categories')
  await admin.end()
  // A read of the table itself (the list would come from the instance's cache).
  const res = await broken.inject({ method: 'GET', url: '/v1/categories/1', headers: AUTH })
  assertErrorBody(t, res, 500, 'INTERNAL_ERROR')
  t.equal(res.json().message, 'internal error')
  t.notMatch(res.body, /categories|relation|SELECT|at /)
})

t.test('an unreachable database is a 503 with Retry-After within a bounded time, and the service recovers', async t => {
  const downDb = await db.createDatabase()
  const { app: down } = await testApp(t, downDb, { DB_CONNECTION_TIMEOUT_MS: '1000' })
  t.equal((await down.inject({ method: 'POST', url: '/v1/categories', ...json({ name: 'before' }) })).statusCode, 201)
  // Take the database away under the running app: terminate its connections and rename it.
  const name = new URL(downDb).pathname.slice(1)
  // An operator's work: terminating another role's sessions and renaming its database take the superuser.
  const admin = new pg.Client({ connectionString: db.adminUrl })
  await admin.connect()
  t.teardown(async () => {
    await admin.end()
  })
  // pg_terminate_backend only signals: a backend may still be exiting, or the app's change feed may reconnect,
  // when the rename looks (55006, "being accessed by other users"). So terminate and rename until it holds.
  await until(
    'the database is renamed away',
    async () => {
      await admin.query(
        'SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()',
        [name]
      )
      try {
        await admin.query(`ALTER DATABASE ${name} RENAME TO ${name}_away`)
        return true
      } catch (err) {
        if ((err as { code?: string }).code === '55006') return false
        throw err
      }
    },
    10000,
    20
  )
  // Until its listening connection is seen to end, the cached list is still vouched for: app.inject never touches a
  // socket, and a request injected at once could come before that end is read.
  await until('the change feed has lost its connection', async () => !down.changeFeed.listening)
  for (const request of [
    { method: 'GET' as const, url: '/v1/categories', headers: AUTH },
    { method: 'POST' as const, url: '/v1/categories', ...json({ name: 'during' }) },
    { method: 'GET' as const, url: '/v1/categories/1', headers: AUTH },
    { method: 'GET' as const, url: '/health/ready' }
  ]) {
    const started = Date.now()
    const res = await down.inject(request)
    assertErrorBody(t, res, 503, 'SERVICE_UNAVAILABLE')
    t.equal(res.headers['retry-after'], '1', `${request.method} ${request.url}: Retry-After`)
    t.ok(Date.now() - started < 5000, `${request.method} ${request.url}: answered in ${Date.now() - started} ms`)
  }
  t.equal((await down.inject({ method: 'GET', url: '/health/live' })).statusCode, 200, 'still alive')
  await admin.query(`ALTER DATABASE ${name}_away RENAME TO ${name}`)
  const back = await down.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  t.equal(back.statusCode, 200, 'recovers without a restart')
  t.same(
    (back.json() as Array<{ name: string }>).map(c => c.name),
    ['before'],
    'the 503 create left no row'
  )
})

t.test("request log lines: one per request at info, each with the request id and the key's id", async t => {
  const { app: infoApp, logs: infoLogs } = await testApp(t, db.url, { LOG_LEVEL: 'info' })
  await infoApp.inject({ method: 'GET', url: '/v1/categories', headers: { ...AUTH, 'x-request-id': 'ok-1' } })
  await infoApp.inject({ method: 'GET', url: '/v1/nope', headers: { ...AUTH, 'x-request-id': 'fail-1' } })
  const completed = infoLogs.lines.map(line => JSON.parse(line)).filter(entry => entry.msg === 'request completed')
  t.same(
    completed.map(entry => [entry.requestId, entry.statusCode, entry.level]),
    [
      ['ok-1', 200, 30],
      ['fail-1', 404, 30]
    ]
  )
  t.same(completed[1]?.req, { method: 'GET', url: '/v1/nope', remoteAddress: '127.0.0.1', apiKeyId: 'static-1' })

  const { app: warnApp, logs: warnLogs } = await testApp(t, db.url, { LOG_LEVEL: 'warn' })
  await warnApp.inject({ method: 'GET', url: '/v1/categories?secret=1', headers: { ...AUTH, 'x-request-id': 'ok-2' } })
  t.notOk(
    warnLogs.lines.some(line => line.includes('request completed')),
    'LOG_LEVEL=warn drops the access lines'
  )
  await infoApp.inject({ method: 'GET', url: '/v1/categories?secret=1', headers: { ...AUTH, 'x-request-id': 'ok-3' } })
  const line = infoLogs.lines.map(line => JSON.parse(line)).find(entry => entry.requestId === 'ok-3')
  t.equal(line?.req.url, '/v1/categories', 'the query string is never logged')
})
