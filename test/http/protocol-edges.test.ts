import { connect } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { gzipSync } from 'node:zlib'
import t, { type Test } from 'tap'
import { startMetricsServer } from '../../src/http/metrics.js'
import { TEST_KEY, listeningApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { freePort } from '../helpers/ports.js'

/*
 * Every answer is ours, whatever layer produces it (docs/api.md, "HTTP itself"): Node's
 * parser, Node's server, Fastify's router and our hooks. Raw sockets, because an HTTP
 * client would refuse to send most of these requests.
 */

const db = await testDatabase(t)
const { app, port } = await listeningApp(t, db.url)

interface Answer {
  status: number
  headers: Record<string, string>
  body: string
}

/** Splits the bytes a connection received into responses (HEAD: bodies are empty whatever Content-Length says). */
function responses (bytes: Buffer, head: boolean): Answer[] {
  const answers: Answer[] = []
  let rest = bytes
  while (rest.length > 0) {
    const end = rest.indexOf('\r\n\r\n')
    if (end === -1) throw new Error(`an incomplete response: ${JSON.stringify(rest.toString('latin1'))}`)
    const [statusLine = '', ...lines] = rest.subarray(0, end).toString('latin1').split('\r\n')
    const status = /^HTTP\/1\.1 (\d{3}) /.exec(statusLine)
    if (status === null) throw new Error(`not a status line: ${JSON.stringify(statusLine)}`)
    const headers: Record<string, string> = {}
    for (const line of lines) {
      const colon = line.indexOf(':')
      headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim()
    }
    const code = Number(status[1])
    const length = head || code < 200 || code === 204 || code === 304 ? 0 : Number(headers['content-length'])
    if (Number.isNaN(length)) throw new Error(`a response without Content-Length: ${statusLine}`)
    const body = rest.subarray(end + 4, end + 4 + length)
    if (body.length < length) throw new Error(`a body cut short: ${statusLine}`)
    answers.push({ status: code, headers, body: body.toString('utf8') })
    rest = rest.subarray(end + 4 + length)
  }
  return answers
}

/** Writes `steps` (bytes, or pauses in ms) on a fresh connection and reads until the server closes it. */
async function exchange (
  steps: Array<string | Buffer | number>,
  options: { head?: boolean; port?: number } = {}
): Promise<Answer[]> {
  const socket = connect(options.port ?? port, '127.0.0.1')
  const chunks: Buffer[] = []
  socket.on('data', chunk => {
    chunks.push(chunk)
  })
  socket.on('error', () => {})
  const closed = new Promise<boolean>(resolve =>
    socket.once('close', () => {
      resolve(true)
    })
  )
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve)
    socket.once('error', reject)
  })
  for (const step of steps) {
    if (typeof step === 'number') await sleep(step)
    else socket.write(step)
  }
  // write, not end: Node's server drops a request whose client half-closes before the answer.
  const done = await Promise.race([closed, sleep(5000, false)])
  socket.destroy()
  if (!done) {
    throw new Error(
      `the server kept the connection open; it sent ${JSON.stringify(Buffer.concat(chunks).toString('latin1'))}`
    )
  }
  return responses(Buffer.concat(chunks), options.head === true)
}

const KEY = `Authorization: Bearer ${TEST_KEY}`
const CLOSE = 'Connection: close'

/** A request head: the request line, then each header line, then the blank line. */
const request = (line: string, ...headers: string[]): string => `${[line, ...headers].join('\r\n')}\r\n\r\n`

/** Exactly one answer, in the Error shape, with this status, code and message. */
function assertError (
  t: Test, answers: Answer[], status: number, code: string, message: string, label: string
): Answer {
  t.equal(answers.length, 1, `${label}: one response`)
  const answer = answers[0] ?? { status: 0, headers: {}, body: '' }
  t.equal(answer.status, status, `${label}: ${status}`)
  t.equal(answer.headers['content-type'], 'application/json; charset=utf-8', `${label}: media type`)
  let body: unknown
  try {
    body = JSON.parse(answer.body)
  } catch {
    body = answer.body
  }
  t.same(body, { code, message, status }, `${label}: Error body`)
  return answer
}

const NOT_HTTP = 'the request is not valid HTTP'

t.test('an HTTP/1.1 request without Host is 400, through Fastify (it has a request id)', async t => {
  const answer = assertError(
    t,
    await exchange([request('GET /health/live HTTP/1.1', CLOSE)]),
    400,
    'VALIDATION_FAILED',
    'the Host header is required',
    'no Host'
  )
  t.match(answer.headers['x-request-id'], /^[0-9a-f-]{36}$/)
})

t.test('an HTTP/1.0 request without Host is served', async t => {
  const [answer] = await exchange([request('GET /health/live HTTP/1.0')])
  t.equal(answer?.status, 200)
  t.equal(answer?.body, '{"status":"ok"}')
})

t.test('a Host that is not host[:port] is 400', async t => {
  for (const host of [
    'Host:',
    'Host: exa mple',
    'Host: a/b',
    'Host: user@example.com',
    'Host: example.com:http',
    'Host: é.example'
  ]) {
    assertError(
      t,
      await exchange([request('GET /health/live HTTP/1.1', host, CLOSE)]),
      400,
      'VALIDATION_FAILED',
      'the Host header must be a host name or address and an optional port',
      host
    )
  }
  for (const host of ['Host: example.com', 'Host: 127.0.0.1:8080', 'Host: [::1]:3000', 'Host: my_host.internal']) {
    t.equal((await exchange([request('GET /health/live HTTP/1.1', host, CLOSE)]))[0]?.status, 200, host)
  }
})

t.test('an expectation other than 100-continue is 417', async t => {
  for (const expect of ['Expect: foo', 'Expect: 200-ok', 'Expect: 100-continue, foo']) {
    const answers = await exchange([request('GET /health/live HTTP/1.1', 'Host: x', expect, CLOSE)])
    // Node sends 100 Continue itself when the list names 100-continue; the final answer is still ours.
    const final = expect.includes('100-continue') ? answers.slice(1) : answers
    if (final !== answers) t.equal(answers[0]?.status, 100, `${expect}: 100 Continue first`)
    assertError(t, final, 417, 'EXPECTATION_FAILED', 'the only expectation supported is 100-continue', expect)
  }
})

t.test('Expect: 100-continue gets 100 Continue, then the answer', async t => {
  const body = '{"name":"continued"}'
  const answers = await exchange([
    request(
      'POST /v1/categories HTTP/1.1',
      'Host: x',
      KEY,
      'Content-Type: application/json',
      `Content-Length: ${body.length}`,
      'Expect: 100-continue',
      CLOSE
    ),
    100,
    body
  ])
  t.same(
    answers.map(a => a.status),
    [100, 201]
  )
})

t.test('CONNECT is 501: the service is not a proxy', async t => {
  for (const target of ['example.com:443', '127.0.0.1:5432', '/v1/categories']) {
    const answer = assertError(
      t,
      await exchange([request(`CONNECT ${target} HTTP/1.1`, `Host: ${target}`)]),
      501,
      'NOT_IMPLEMENTED',
      'CONNECT is not supported: this service is not a proxy',
      target
    )
    t.equal(answer.headers.connection, 'close')
  }
})

t.test('a method Node does not know is 501; a request line that is not HTTP is 400', async t => {
  for (const method of ['FOO', 'get', 'BREW']) {
    assertError(
      t,
      await exchange([request(`${method} /health/live HTTP/1.1`, 'Host: x')]),
      501,
      'NOT_IMPLEMENTED',
      'the request method is not implemented',
      method
    )
  }
  for (const line of ['hello', 'GET /a b HTTP/1.1', 'GET /health/live HTTP/1.1\nHost: x']) {
    assertError(t, await exchange([request(line)]), 400, 'VALIDATION_FAILED', NOT_HTTP, line)
  }
})

t.test('a known path with another method is 405 with Allow, on every known path', async t => {
  const cases: Array<[string, string, boolean]> = [
    ['/health/live', 'GET, HEAD', false],
    ['/health/ready', 'GET, HEAD', false],
    ['/docs', 'GET, HEAD', false],
    ['/docs/', 'GET, HEAD', false],
    ['/docs/json', 'GET, HEAD', false],
    ['/docs/yaml', 'GET, HEAD', false],
    ['/docs/openapi.json', 'GET, HEAD', false],
    ['/docs/petstore.postman_collection.json', 'GET, HEAD', false],
    ['/docs/static/index.html', 'GET, HEAD', false],
    ['/v1/categories', 'GET, POST, HEAD', true],
    ['/v1/categories/1', 'DELETE, GET, PATCH, HEAD', true],
    // A trailing slash is the item path with an empty id, so POST there is 405 like POST /v1/categories/1.
    ['/v1/categories/', 'DELETE, GET, PATCH, HEAD', true],
    ['/v1/pets/1', 'GET, HEAD', true],
    ['/v1/store/orders', 'GET, HEAD', true]
  ]
  const methods = ['POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS', 'TRACE', 'PROPFIND']
  for (const [path, allow, needsKey] of cases) {
    for (const method of methods.filter(m => !allow.includes(m))) {
      const key = needsKey ? [KEY] : []
      // With a body of a type no route reads: the method is refused before the body is looked at.
      const body = ['Content-Type: text/plain', 'Content-Length: 7']
      const answer = assertError(
        t,
        await exchange([request(`${method} ${path} HTTP/1.1`, 'Host: x', ...key, ...body, CLOSE), 'ignored']),
        405,
        'METHOD_NOT_ALLOWED',
        `${method} is not allowed on ${path}; use ${allow}`,
        `${method} ${path}`
      )
      t.equal(answer.headers.allow, allow, `${method} ${path}: Allow`)
    }
  }
  assertError(
    t,
    await exchange([request('POST /v1/categories/ HTTP/1.1', 'Host: x', CLOSE)]),
    401,
    'UNAUTHORIZED',
    'an API key is required: send Authorization: Bearer <key>',
    'under /v1 the key comes first'
  )
  assertError(
    t,
    await exchange([request('POST /health/live/ HTTP/1.1', 'Host: x', CLOSE)]),
    404,
    'NOT_FOUND',
    'no route for POST /health/live/',
    'a trailing slash elsewhere is another path'
  )
})

t.test('OPTIONS * is 405 with an empty Allow; any other target that is not a path is 400', async t => {
  const answer = assertError(
    t,
    await exchange([request('OPTIONS * HTTP/1.1', 'Host: x', CLOSE)]),
    405,
    'METHOD_NOT_ALLOWED',
    'OPTIONS * is not supported: send requests to a path',
    'OPTIONS *'
  )
  t.equal(answer.headers.allow, '')
  for (const target of ['*', 'foo://x/health/live']) {
    assertError(
      t,
      await exchange([request(`GET ${target} HTTP/1.1`, 'Host: x', CLOSE)]),
      400,
      'VALIDATION_FAILED',
      'the request target must be a path',
      `GET ${target}`
    )
  }
  for (const target of ['x:80', 'mailto:a@b']) {
    assertError(
      t,
      await exchange([request(`GET ${target} HTTP/1.1`, 'Host: x', CLOSE)]),
      400,
      'VALIDATION_FAILED',
      NOT_HTTP,
      target
    )
  }
})

t.test('an absolute-form target is its path: the key is still required under /v1', async t => {
  for (const target of ['http://x/v1/categories', 'HTTPS://x:443/v1/categories', 'http://x/v1/categories?a=1']) {
    assertError(
      t,
      await exchange([request(`GET ${target} HTTP/1.1`, 'Host: x', CLOSE)]),
      401,
      'UNAUTHORIZED',
      'an API key is required: send Authorization: Bearer <key>',
      target
    )
    const [answer] = await exchange([request(`GET ${target} HTTP/1.1`, 'Host: x', KEY, CLOSE)])
    t.equal(answer?.status, 200, `${target} with a key`)
    t.ok(Array.isArray(JSON.parse(answer?.body ?? '')), `${target}: the list`)
  }
  t.equal((await exchange([request('GET http://x HTTP/1.1', 'Host: x', CLOSE)]))[0]?.status, 404, 'http://x is /')
})

t.test('a percent-encoded letter in the path is the letter: /%761/categories needs the key too', async t => {
  for (const path of ['/%761/categories', '/%76%31/categories', '/v1/categori%65s', '/%76%31/categori%65s']) {
    assertError(
      t,
      await exchange([request(`GET ${path} HTTP/1.1`, 'Host: x', CLOSE)]),
      401,
      'UNAUTHORIZED',
      'an API key is required: send Authorization: Bearer <key>',
      path
    )
    t.equal(
      (await exchange([request(`GET ${path} HTTP/1.1`, 'Host: x', KEY, CLOSE)]))[0]?.status,
      200,
      `${path} with a key`
    )
  }
  // An encoded slash stays encoded, for the router too: one segment that is not /v1.
  assertError(
    t,
    await exchange([request('GET /v1%2Fcategories HTTP/1.1', 'Host: x', CLOSE)]),
    404,
    'NOT_FOUND',
    'no route for GET /v1%2Fcategories',
    'an encoded slash'
  )
})

async function categoryCount (): Promise<number> {
  const [answer] = await exchange([request('GET /v1/categories HTTP/1.1', 'Host: x', KEY, CLOSE)])
  return (JSON.parse(answer?.body ?? '') as unknown[]).length
}

t.test(
  'a body with a Content-Encoding other than identity is 415 with Accept-Encoding: identity; nothing is stored',
  async t => {
    const before = await categoryCount()
    const plain = '{"name":"coded"}'
    const cases: Array<[string, Buffer]> = [
      ['gzip', gzipSync(plain)],
      ['x-foo', Buffer.from(plain)],
      ['gzip', Buffer.from(plain)],
      ['identity, gzip', Buffer.from(plain)],
      ['br', Buffer.from(plain)]
    ]
    for (const [coding, body] of cases) {
      const answer = assertError(
        t,
        await exchange([
          request(
            'POST /v1/categories HTTP/1.1',
            'Host: x',
            KEY,
            'Content-Type: application/json',
            `Content-Encoding: ${coding}`,
            `Content-Length: ${body.length}`,
            CLOSE
          ),
          body
        ]),
        415,
        'UNSUPPORTED_MEDIA_TYPE',
        'Content-Encoding must be identity: send the body uncompressed',
        coding
      )
      t.equal(answer.headers['accept-encoding'], 'identity', `${coding}: Accept-Encoding`)
    }
    t.equal(await categoryCount(), before, 'nothing was stored')
    const [created] = await exchange([
      request(
        'POST /v1/categories HTTP/1.1',
        'Host: x',
        KEY,
        'Content-Type: application/json',
        'Content-Encoding: identity',
        `Content-Length: ${plain.length}`,
        CLOSE
      ),
      plain
    ])
    t.equal(created?.status, 201, 'identity is read')
  }
)

t.test(
  'Transfer-Encoding: chunked last and alone, in HTTP/1.1 only; one answer, and the connection closes',
  async t => {
    const post = (...headers: string[]): string =>
      request('POST /v1/categories HTTP/1.1', 'Host: x', KEY, 'Content-Type: application/json', ...headers)
    assertError(
      t,
      await exchange([post('Transfer-Encoding: gzip'), '{"name":"te"}']),
      400,
      'VALIDATION_FAILED',
      'Transfer-Encoding must end with chunked',
      'gzip alone'
    )
    assertError(
      t,
      await exchange([post('Transfer-Encoding: chunked, gzip')]),
      400,
      'VALIDATION_FAILED',
      NOT_HTTP,
      'chunked, gzip'
    )
    assertError(
      t,
      await exchange([post('Transfer-Encoding: gzip, chunked'), '0\r\n\r\n']),
      501,
      'NOT_IMPLEMENTED',
      'the only transfer coding supported is chunked',
      'gzip, chunked'
    )
    assertError(
      t,
      await exchange([post('Transfer-Encoding: chunked', 'Content-Length: 5'), '0\r\n\r\n']),
      400,
      'VALIDATION_FAILED',
      NOT_HTTP,
      'both Transfer-Encoding and Content-Length'
    )
    assertError(
      t,
      await exchange([
        request(
          'POST /v1/categories HTTP/1.0',
          'Host: x',
          KEY,
          'Content-Type: application/json',
          'Transfer-Encoding: chunked'
        ),
        '0\r\n\r\n'
      ]),
      400,
      'VALIDATION_FAILED',
      'Transfer-Encoding is not allowed in HTTP/1.0',
      'HTTP/1.0'
    )
    assertError(
      t,
      await exchange([request('GET /health/live HTTP/1.1', 'Host: x', 'Transfer-Encoding: gzip')]),
      400,
      'VALIDATION_FAILED',
      'Transfer-Encoding must end with chunked',
      'a route without a body'
    )
  }
)

t.test('HTTP versions other than 1.0 and 1.1 are 505', async t => {
  for (const version of ['HTTP/2.0', 'HTTP/1.2', 'HTTP/3.0']) {
    const answer = assertError(
      t,
      await exchange([request(`GET /health/live ${version}`, 'Host: x')]),
      505,
      'HTTP_VERSION_NOT_SUPPORTED',
      'only HTTP/1.0 and HTTP/1.1 are supported',
      version
    )
    t.equal(answer.headers.connection, 'close', `${version}: Connection: close`)
  }
  assertError(
    t,
    await exchange(['PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n']),
    505,
    'HTTP_VERSION_NOT_SUPPORTED',
    'only HTTP/1.0 and HTTP/1.1 are supported',
    'the HTTP/2 connection preface'
  )
})

t.test('a request line over MAX_HEADER_BYTES is 414 (headers over it: 431, in resource-limits.test.ts)', async t => {
  assertError(
    t,
    await exchange([request(`GET /v1/categories/${'1'.repeat(20000)} HTTP/1.1`, 'Host: x')]),
    414,
    'URI_TOO_LONG',
    'the request URL is too long',
    'a long URL'
  )
})

t.test('malformed header lines are 400', async t => {
  for (const line of [
    'Bad Header: 1',
    'Host : x',
    'X-Folded: a\r\n b',
    'X-Nul: a\u0000b',
    'Content-Length: abc',
    'Content-Length: 1, 2'
  ]) {
    assertError(
      t,
      await exchange([request('POST /health/live HTTP/1.1', 'Host: x', line)]),
      400,
      'VALIDATION_FAILED',
      NOT_HTTP,
      line
    )
  }
})

t.test('a parse error after the answer has begun closes the connection, without a second answer', async t => {
  const head = request(
    'POST /v1/categories HTTP/1.1',
    'Host: x',
    'Content-Type: application/json',
    'Transfer-Encoding: chunked'
  )
  // No key: 401 before the body is read; then the body turns out not to be chunked.
  assertError(
    t,
    await exchange([head, 300, 'zz\r\n{}\r\n0\r\n\r\n']),
    401,
    'UNAUTHORIZED',
    'an API key is required: send Authorization: Bearer <key>',
    'a bad chunk after the 401'
  )
})

t.test(
  'a bad request pipelined after a good one: the good one is answered first, then the Error, ' +
    'then the connection closes',
  async t => {
    const good = request('GET /health/live HTTP/1.1', 'Host: x')
    for (const [bad, status, code, message] of [
      [request('GET /x HTTP/1.1', 'Bad Header: 1'), 400, 'VALIDATION_FAILED', NOT_HTTP],
      [request('FOO /x HTTP/1.1', 'Host: x'), 501, 'NOT_IMPLEMENTED', 'the request method is not implemented']
    ] as const) {
      const answers = await exchange([good + bad])
      t.equal(answers[0]?.status, 200, `${code}: the good request first`)
      assertError(t, answers.slice(1), status, code, message, `${code} second`)
    }
  }
)

t.test('HEAD answers as GET does, without a body', async t => {
  for (const path of [
    '/health/live',
    '/docs',
    '/docs/',
    '/docs/json',
    '/docs/openapi.json',
    '/docs/static/index.html',
    '/docs/petstore.postman_collection.json',
    '/v1/categories',
    '/v1/categories/1',
    '/v1/pets/1',
    '/v1/store/orders',
    '/v1/nowhere'
  ]) {
    const [get] = await exchange([request(`GET ${path} HTTP/1.1`, 'Host: x', KEY, CLOSE)])
    const headAnswers = await exchange([request(`HEAD ${path} HTTP/1.1`, 'Host: x', KEY, CLOSE)], { head: true })
    t.equal(headAnswers.length, 1, `HEAD ${path}: one response`)
    t.equal(headAnswers[0]?.status, get?.status, `HEAD ${path}: ${String(get?.status)}`)
    t.equal(headAnswers[0]?.headers['content-type'], get?.headers['content-type'], `HEAD ${path}: content type`)
    t.equal(headAnswers[0]?.body, '', `HEAD ${path}: no body`)
  }
})

t.test('the metrics listener answers in the same shape', async t => {
  const metricsPort = await freePort()
  const server = await startMetricsServer(app.metrics, { port: metricsPort, host: '127.0.0.1' })
  t.teardown(() => {
    server?.close()
  })
  const on = { port: metricsPort }
  // HEAD: the metrics themselves come chunked, which responses() does not read.
  const head = await exchange([request('HEAD /metrics HTTP/1.1', 'Host: x', CLOSE)], { ...on, head: true })
  t.same(
    head.map(a => [a.status, a.body]),
    [[200, '']],
    'HEAD /metrics'
  )
  const refused = assertError(
    t,
    await exchange([request('POST /metrics HTTP/1.1', 'Host: x', CLOSE)], on),
    405,
    'METHOD_NOT_ALLOWED',
    'POST is not allowed on /metrics; use GET, HEAD',
    'POST /metrics'
  )
  t.equal(refused.headers.allow, 'GET, HEAD')
  assertError(
    t,
    await exchange([request('GET /other HTTP/1.1', 'Host: x', CLOSE)], on),
    404,
    'NOT_FOUND',
    'metrics are at GET /metrics',
    'another path'
  )
  assertError(
    t,
    await exchange([request('GET /metrics HTTP/1.1', CLOSE)], on),
    400,
    'VALIDATION_FAILED',
    'the Host header is required',
    'no Host'
  )
  assertError(
    t,
    await exchange([request('GET /metrics HTTP/1.1', 'Host: x', 'Expect: foo', CLOSE)], on),
    417,
    'EXPECTATION_FAILED',
    'the only expectation supported is 100-continue',
    'Expect: foo'
  )
  assertError(
    t,
    await exchange([request('CONNECT x:443 HTTP/1.1', 'Host: x:443')], on),
    501,
    'NOT_IMPLEMENTED',
    'CONNECT is not supported: this service is not a proxy',
    'CONNECT'
  )
  assertError(
    t,
    await exchange([request('FOO /metrics HTTP/1.1', 'Host: x')], on),
    501,
    'NOT_IMPLEMENTED',
    'the request method is not implemented',
    'FOO'
  )
  assertError(
    t,
    await exchange([request('GET /metrics HTTP/1.1', 'Bad Header: 1')], on),
    400,
    'VALIDATION_FAILED',
    NOT_HTTP,
    'a malformed header'
  )
  const absolute = await exchange([request('HEAD http://x/metrics HTTP/1.1', 'Host: x', CLOSE)], { ...on, head: true })
  t.equal(absolute[0]?.status, 200, 'absolute form')
})
