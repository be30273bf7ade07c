import { connect } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyInstance } from 'fastify'
import t, { type Test } from 'tap'
import { AUTH, TEST_KEY, listeningApp, metric, testApp, until } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { lockCategories, lockWaiter } from '../helpers/pg-client.js'

/*
 * OWASP API4 (unrestricted resource consumption): every limit, exceeded over a
 * real socket where the socket matters, answers the documented status (or
 * closes the connection) instead of hanging, and the process stays healthy.
 */

const db = await testDatabase(t)

interface RawResult {
  text: string
  status: number | undefined
  closed: boolean
  ms: number
}

/** Writes `steps` to a fresh connection (numbers are pauses in ms) and reads until the server closes or `limitMs`
 * passes. */
async function raw (port: number, steps: Array<string | Buffer | number>, limitMs = 8000): Promise<RawResult> {
  const socket = connect(port, '127.0.0.1')
  const chunks: Buffer[] = []
  const started = performance.now()
  let closed = false
  socket.on('data', chunk => {
    chunks.push(chunk)
  })
  socket.on('error', () => {})
  const done = new Promise<void>(resolve =>
    socket.once('close', () => {
      closed = true
      resolve()
    })
  )
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve)
    socket.once('error', reject)
  })
  for (const step of steps) {
    if (closed || socket.destroyed) break
    if (typeof step === 'number') await sleep(step)
    else socket.write(step)
  }
  await Promise.race([done, sleep(Math.max(0, limitMs - (performance.now() - started)))])
  const ms = performance.now() - started
  socket.destroy()
  const text = Buffer.concat(chunks).toString('utf8')
  const status = /^HTTP\/1\.1 (\d{3})/.exec(text)?.[1]
  return { text, status: status === undefined ? undefined : Number(status), closed, ms }
}

function errorBodyOf (text: string): unknown {
  const start = text.indexOf('\r\n\r\n')
  return JSON.parse(text.slice(start + 4))
}

async function assertHealthy (t: Test, app: FastifyInstance): Promise<void> {
  const res = await app.inject({ method: 'GET', url: '/health/ready' })
  t.equal(res.statusCode, 200, 'GET /health/ready is 200 afterwards')
}

const post = (headers: string): string =>
  'POST /v1/categories HTTP/1.1\r\nHost: localhost\r\n' +
  `Authorization: Bearer ${TEST_KEY}\r\nContent-Type: application/json\r\n${headers}\r\n`

t.test('body limit: 64 KiB by default, 413 Error body however the size is announced', async t => {
  const { app, port } = await listeningApp(t, db.url)
  const big = JSON.stringify({ name: 'big', description: 'x'.repeat(70000) })

  const injected = await app.inject({
    method: 'POST',
    url: '/v1/categories',
    headers: { ...AUTH, 'content-type': 'application/json' },
    payload: big
  })
  t.equal(injected.statusCode, 413)
  t.same(injected.json(), { code: 'PAYLOAD_TOO_LARGE', message: injected.json().message, status: 413 })

  const announced = await raw(port, [post(`Content-Length: ${Buffer.byteLength(big)}\r\n`), big])
  t.equal(announced.status, 413, 'Content-Length over the limit')
  t.same(Object.keys(errorBodyOf(announced.text) as object).sort(), ['code', 'message', 'status'])

  const lyingLarge = await raw(port, [post('Content-Length: 10000000\r\n'), '{"name":"small"}'], 5000)
  t.equal(lyingLarge.status, 413, 'a Content-Length over the limit is refused without waiting for the body')
  t.ok(lyingLarge.ms < 4000, `answered in ${Math.round(lyingLarge.ms)} ms`)

  const chunked = await raw(port, [
    post('Transfer-Encoding: chunked\r\n'),
    ...Array.from({ length: 20 }, () => `1000\r\n${'x'.repeat(4096)}\r\n`),
    '0\r\n\r\n'
  ])
  t.equal(chunked.status, 413, 'a chunked body with no Content-Length is counted as it arrives')
  t.match(errorBodyOf(chunked.text), { code: 'PAYLOAD_TOO_LARGE', status: 413 })

  const lyingSmall = await raw(port, [post('Content-Length: 16\r\n'), `{"name":"small"}${'y'.repeat(100000)}`])
  // Only the announced 16 bytes are the body; the rest is parsed as the next request, which is not HTTP:
  // 400 and the connection closes (the first request's 201 may or may not get out first).
  t.match(lyingSmall.text, /HTTP\/1\.1 400/, 'a Content-Length under the real size: the surplus is a 400')
  t.match(errorBodyOf(lyingSmall.text.slice(lyingSmall.text.lastIndexOf('HTTP/1.1 400'))), {
    code: 'VALIDATION_FAILED',
    status: 400
  })
  t.ok(lyingSmall.closed, 'and the connection is closed')
  await assertHealthy(t, app)
})

t.test('BODY_LIMIT_BYTES sets the limit', async t => {
  const { app } = await testApp(t, db.url, { BODY_LIMIT_BYTES: '100' })
  const at = JSON.stringify({ name: 'n'.repeat(100 - 11) })
  t.equal(Buffer.byteLength(at), 100)
  t.equal(
    (
      await app.inject({
        method: 'POST',
        url: '/v1/categories',
        headers: { ...AUTH, 'content-type': 'application/json' },
        payload: at
      })
    ).statusCode,
    201
  )
  const over = await app.inject({
    method: 'POST',
    url: '/v1/categories',
    headers: { ...AUTH, 'content-type': 'application/json' },
    payload: at + ' '
  })
  t.equal(over.statusCode, 413)
  await assertHealthy(t, app)
})

t.test('header size: 431 Error body over MAX_HEADER_BYTES (16 KiB by default)', async t => {
  const { app, port } = await listeningApp(t, db.url)
  const res = await raw(port, [
    `GET /health/live HTTP/1.1\r\nHost: localhost\r\nX-Filler: ${'a'.repeat(20000)}\r\n\r\n`
  ])
  t.equal(res.status, 431)
  t.match(res.text, /\r\nContent-Type: application\/json; charset=utf-8\r\n/i, 'the media type of an Error body')
  t.same(errorBodyOf(res.text), { code: 'HEADERS_TOO_LARGE', message: 'request headers are too large', status: 431 })
  t.ok(res.closed, 'the connection is closed')
  const fits = await raw(port, [
    `GET /health/live HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nX-Filler: ${'a'.repeat(8000)}\r\n\r\n`
  ])
  t.equal(fits.status, 200, 'headers under the limit are fine')
  await assertHealthy(t, app)
})

t.test('slowloris: headers trickled slowly are cut off with 408 after HEADERS_TIMEOUT_MS', async t => {
  const { app, port } = await listeningApp(t, db.url, { HEADERS_TIMEOUT_MS: '1000' })
  const trickle = Array.from({ length: 40 }, (_, i) => [`X-Slow-${i}: y\r\n`, 200]).flat()
  const res = await raw(port, ['GET /health/live HTTP/1.1\r\nHost: localhost\r\n', ...trickle], 8000)
  t.equal(res.status, 408)
  t.same(errorBodyOf(res.text), {
    code: 'REQUEST_TIMEOUT',
    message: 'the request took too long to arrive',
    status: 408
  })
  t.ok(res.closed && res.ms < 3500, `closed after ${Math.round(res.ms)} ms (limit 1000 ms, checked every second)`)

  const silent = await raw(port, [], 8000)
  t.ok(silent.closed && silent.ms < 3500, `a connection that sends nothing is closed after ${Math.round(silent.ms)} ms`)
  await assertHealthy(t, app)
})

t.test('a body trickled slowly is cut off after REQUEST_TIMEOUT_MS', async t => {
  const { app, port } = await listeningApp(t, db.url, { REQUEST_TIMEOUT_MS: '1500', HEADERS_TIMEOUT_MS: '1000' })
  const body = '{"name":"slow body"}'
  const res = await raw(
    port,
    [post(`Content-Length: ${body.length}\r\n`), ...body.split('').flatMap(c => [c, 300])],
    10000
  )
  t.ok(res.closed, 'the connection is closed')
  t.ok(res.ms < 5000, `after ${Math.round(res.ms)} ms`)
  t.ok(res.status === 408 || res.status === undefined, `408 or a closed connection, got ${String(res.status)}`)
  if (res.status === 408) t.match(errorBodyOf(res.text), { code: 'REQUEST_TIMEOUT', status: 408 })
  await assertHealthy(t, app)
})

t.test('an idle keep-alive connection is closed after KEEP_ALIVE_TIMEOUT_MS', async t => {
  const { app, port } = await listeningApp(t, db.url, { KEEP_ALIVE_TIMEOUT_MS: '500' })
  const res = await raw(port, ['GET /health/live HTTP/1.1\r\nHost: localhost\r\n\r\n'], 8000)
  t.equal(res.status, 200)
  t.ok(res.closed && res.ms < 3000, `closed after ${Math.round(res.ms)} ms`)
  await assertHealthy(t, app)
})

t.test('the pool queue is bounded: beyond DB_POOL_MAX_WAITING, 503 at once', async t => {
  const { app } = await testApp(t, db.url, {
    DB_POOL_MAX: '1',
    DB_POOL_MAX_WAITING: '1',
    DB_CONNECTION_TIMEOUT_MS: '5000',
    DB_STATEMENT_TIMEOUT_MS: '5000'
  })
  const locker = await lockCategories(t, db.url, 'ACCESS EXCLUSIVE')
  const holder = app.inject({
    method: 'POST',
    url: '/v1/categories',
    headers: { ...AUTH, 'content-type': 'application/json' },
    payload: '{"name":"holds the connection"}'
  })
  await until('the create waits for the table lock', async () => await lockWaiter(locker))
  const waiter = app.inject({ method: 'GET', url: '/v1/categories/1', headers: AUTH })
  await until('the read waits for the pool', async () => await metric(app, 'db_pool_requests_waiting') === 1)
  const started = performance.now()
  const refused = await app.inject({ method: 'GET', url: '/v1/categories/1', headers: AUTH })
  const ms = performance.now() - started
  t.equal(refused.statusCode, 503)
  t.same(refused.json(), { code: 'SERVICE_UNAVAILABLE', message: refused.json().message, status: 503 })
  t.match(String(refused.headers['retry-after']), /^\d+$/)
  t.ok(ms < 1000, `refused in ${Math.round(ms)} ms, not after the 5 s connection timeout`)
  await locker.query('ROLLBACK')
  t.equal((await holder).statusCode, 201)
  t.ok([200, 404].includes((await waiter).statusCode), 'the one queued request is served')
  await assertHealthy(t, app)
})
