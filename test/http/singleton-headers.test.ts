import { connect } from 'node:net'
import t, { type Test } from 'tap'
import { OTHER_KEY, TEST_KEY, listeningApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

/*
 * A header RFC 9110 allows once, sent twice, is a 400 (docs/hardening.md,
 * "Repeated headers"): Node keeps the first Authorization or Content-Type and
 * drops the second, a proxy in front may keep the other one. Over a real
 * socket, because Node's parser is what decides what req.headers shows.
 */

const db = await testDatabase(t)

interface RawResponse {
  status: number
  headers: string
  body: any
}

/** One request over a fresh connection, header lines exactly as given. */
async function send (port: number, method: string, path: string, lines: string[], body = ''): Promise<RawResponse> {
  const socket = connect(port, '127.0.0.1')
  const chunks: Buffer[] = []
  socket.on('data', chunk => {
    chunks.push(chunk)
  })
  const closed = new Promise<void>((resolve, reject) => {
    socket.once('close', () => {
      resolve()
    })
    socket.once('error', reject)
  })
  const length = body === '' ? [] : [`Content-Length: ${Buffer.byteLength(body)}`]
  // write, not end: Node's server drops a request whose client half-closes before the answer.
  socket.write([`${method} ${path} HTTP/1.1`, ...lines, ...length, 'Connection: close', '', body].join('\r\n'))
  await closed
  const text = Buffer.concat(chunks).toString('utf8')
  const split = text.indexOf('\r\n\r\n')
  const payload = text.slice(split + 4)
  return {
    status: Number(text.slice(9, 12)),
    headers: text.slice(0, split),
    body: payload === '' ? undefined : JSON.parse(payload)
  }
}

const HOST = 'Host: localhost'
const VALID = `Authorization: Bearer ${TEST_KEY}`
const JSON_TYPE = 'Content-Type: application/json'

function assertRepeated (t: Test, res: RawResponse, header: string, label: string): void {
  t.equal(res.status, 400, `${label}: 400`)
  t.same(
    res.body,
    { code: 'VALIDATION_FAILED', message: `the ${header} header must be sent once`, status: 400 },
    `${label}: Error body naming ${header}`
  )
}

t.test('Authorization twice is 400 whatever the keys, before any key is checked or counted', async t => {
  const { port } = await listeningApp(t, db.url, { RATE_LIMIT_AUTH_FAILURES: '2' })
  const pairs: Array<[string, string]> = [
    [VALID, 'Authorization: Bearer wrong'],
    ['Authorization: Bearer wrong', VALID],
    [VALID, VALID],
    [VALID, `authorization: Bearer ${OTHER_KEY}`],
    ['Authorization: Bearer wrong', 'AUTHORIZATION: Bearer wrong'],
    [VALID, 'Authorization:']
  ]
  for (const [first, second] of pairs) {
    for (const path of ['/v1/categories', '/v1/nowhere']) {
      assertRepeated(
        t,
        await send(port, 'GET', path, [HOST, first, second]),
        'Authorization',
        `${first} + ${second} on ${path}`
      )
    }
  }
  // None of the 12 counted as a failed authentication: the address still has its 2 attempts.
  t.equal((await send(port, 'GET', '/v1/categories', [HOST, 'Authorization: Bearer wrong'])).status, 401)
  t.equal((await send(port, 'GET', '/v1/categories', [HOST, 'Authorization: Bearer wrong'])).status, 401)
  t.equal(
    (await send(port, 'GET', '/v1/categories', [HOST, VALID])).status,
    429,
    'then the limit holds, even for a valid key'
  )
  assertRepeated(
    t,
    await send(port, 'GET', '/v1/categories', [HOST, VALID, 'Authorization: Bearer wrong']),
    'Authorization',
    'at a refused address the answer is the same 400'
  )
})

t.test('Content-Type, Idempotency-Key, X-Request-Id and Host twice are 400, and nothing is stored', async t => {
  const { app, port } = await listeningApp(t, db.url)
  const count = async (): Promise<number> =>
    (
      await app.inject({ method: 'GET', url: '/v1/categories', headers: { authorization: `Bearer ${TEST_KEY}` } })
    ).json().length
  const before = await count()
  const body = '{"name":"repeated"}'
  const cases: Array<[string, string[]]> = [
    ['Content-Type', [JSON_TYPE, JSON_TYPE]],
    ['Content-Type', [JSON_TYPE, 'content-type: text/plain']],
    ['Idempotency-Key', [JSON_TYPE, 'Idempotency-Key: a', 'Idempotency-Key: b']],
    ['Idempotency-Key', [JSON_TYPE, 'Idempotency-Key: same', 'idempotency-key: same']],
    ['X-Request-Id', [JSON_TYPE, 'X-Request-Id: a', 'X-Request-Id: b']]
  ]
  for (const [header, lines] of cases) {
    assertRepeated(
      t,
      await send(port, 'POST', '/v1/categories', [HOST, VALID, ...lines], body),
      header,
      lines.join(' + ')
    )
  }
  assertRepeated(
    t,
    await send(port, 'POST', '/v1/categories', [HOST, 'Host: other', VALID, JSON_TYPE], body),
    'Host',
    'two Host lines (RFC 9112 section 3.2: MUST be 400)'
  )
  assertRepeated(
    t,
    await send(port, 'GET', '/health/live', [HOST, 'X-Request-Id: a', 'X-Request-Id: a']),
    'X-Request-Id',
    'outside /v1 too'
  )
  t.equal(await count(), before, 'no row was stored')
  t.equal(
    (
      await send(
        port,
        'POST',
        '/v1/categories',
        [HOST, VALID, JSON_TYPE, 'Idempotency-Key: once', 'X-Request-Id: r-1'],
        body
      )
    ).status,
    201,
    'each once: 201'
  )
})

t.test('Content-Length twice is refused by Node itself: 400 and the connection closes', async t => {
  const { port } = await listeningApp(t, db.url)
  for (const second of ['Content-Length: 2', 'Content-Length: 3']) {
    const res = await send(port, 'POST', '/v1/categories', [HOST, VALID, JSON_TYPE, 'Content-Length: 2', second], '{}')
    t.equal(res.status, 400, second)
    t.equal(res.body.code, 'VALIDATION_FAILED')
    t.match(res.headers, /\r\nConnection: close/i)
  }
})

t.test(
  'If-None-Match and X-Forwarded-For are lists: repeated lines are one list, as RFC 9110 section 5.3 combines them',
  async t => {
    const { port } = await listeningApp(t, db.url, { TRUST_PROXY: 'true' })
    const first = await send(port, 'GET', '/v1/categories', [HOST, VALID])
    const etag = /\r\netag: ("[^"]*")/i.exec(first.headers)?.[1]
    if (etag === undefined) throw new Error('no ETag')
    t.equal(
      (await send(port, 'GET', '/v1/categories', [HOST, VALID, 'If-None-Match: "stale"', `If-None-Match: ${etag}`]))
        .status,
      304,
      'the current tag in the second line'
    )
    t.equal(
      (await send(port, 'GET', '/v1/categories', [HOST, VALID, 'If-None-Match: "stale"', 'If-None-Match: "older"']))
        .status,
      200,
      'no current tag in either line'
    )
    t.equal(
      (
        await send(port, 'GET', '/v1/categories', [
          HOST,
          VALID,
          'X-Forwarded-For: 192.0.2.1',
          'X-Forwarded-For: 192.0.2.2'
        ])
      ).status,
      200,
      'X-Forwarded-For twice'
    )
  }
)
