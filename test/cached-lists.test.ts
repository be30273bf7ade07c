import { connect } from 'node:net'
import { Agent, request } from 'node:http'
import t, { type Test } from 'tap'
import type { FastifyInstance } from 'fastify'
import { AUTH, OTHER_KEY, TEST_KEY, histogram, json, listeningApp, metric, testApp, until } from './helpers/app.js'
import { testDatabase } from './helpers/database.js'
import { listHandler } from '../src/http/replies.js'

/*
 * src/http/cached-lists.ts answers GET of a cached list before Fastify, on a
 * connection that already presented its Authorization header with a valid
 * key. Over real sockets (app.inject never reaches it): its answers must be
 * Fastify's own, byte for byte but the date and a generated request id, and
 * every request it must not answer must reach Fastify.
 */

const db = await testDatabase(t)

interface Answer { status: number, headers: Array<[string, string]>, body: string }

/** One keep-alive connection (one socket), as a client or a balancer holds it. */
function connection (t: Test, port: number): (headers?: Record<string, string>, options?: { path?: string, method?: string }) => Promise<Answer> {
  const agent = new Agent({ keepAlive: true, maxSockets: 1 })
  t.teardown(() => { agent.destroy() })
  return async (headers = AUTH, options = {}) => await new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path: options.path ?? '/v1/categories', method: options.method ?? 'GET', agent, headers }, res => {
      const chunks: Buffer[] = []
      res.on('data', (chunk: Buffer) => { chunks.push(chunk) })
      res.on('end', () => {
        const pairs: Array<[string, string]> = []
        for (let i = 0; i < res.rawHeaders.length; i += 2) pairs.push([res.rawHeaders[i] as string, res.rawHeaders[i + 1] as string])
        resolve({ status: res.statusCode ?? 0, headers: pairs, body: Buffer.concat(chunks).toString('utf8') })
      })
    })
    req.on('error', reject)
    req.end()
  })
}

const header = (answer: Answer, name: string): string | undefined => answer.headers.find(([n]) => n.toLowerCase() === name)?.[1]
/** Everything but what differs between any two responses: the date, and a request id the service made up. */
const comparable = (answer: Answer, generatedId: boolean): unknown => ({
  status: answer.status,
  body: answer.body,
  headers: answer.headers.filter(([name]) => name !== 'Date' && !(generatedId && name === 'x-request-id'))
})
const answered = async (app: FastifyInstance): Promise<number> => await metric(app, 'http_cached_list_answers_total')

/** listeningApp, once its change feed hears (until then every list read goes to the database: ListCache.cached is undefined). */
async function hearingApp (t: Test, env: Record<string, string> = {}, extra: Parameters<typeof listeningApp>[3] = {}): Promise<Awaited<ReturnType<typeof listeningApp>>> {
  const started = await listeningApp(t, await db.createDatabase(), env, extra)
  await until('the change feed hears', async () => await metric(started.app, 'categories_change_feed_listening') === 1)
  return started
}

/** GETs of /v1/categories with this status in the request histogram. */
const requests = async (app: FastifyInstance, status: number): Promise<number> =>
  (await histogram(app, 'http_request_duration_seconds', { route: '/v1/categories', method: 'GET', status: String(status) })).count

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/

t.test('a connection\'s second GET is answered before Fastify, exactly as Fastify answers it', async t => {
  const { app, port } = await hearingApp(t)
  for (const name of ['first', 'second']) t.equal((await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name }) })).statusCode, 201)
  // Fastify's answers: each request is the first on a new connection, so none is remembered yet.
  const fresh = async (headers: Record<string, string>): Promise<Answer> => await connection(t, port)(headers)
  const viaFastify = await fresh(AUTH)
  const etag = header(viaFastify, 'etag') as string
  t.equal(await answered(app), 0, 'a connection\'s first request always goes through Fastify')

  const cases: Array<{ label: string, headers: Record<string, string>, generatedId: boolean, status: number }> = [
    { label: 'the list', headers: AUTH, generatedId: true, status: 200 },
    { label: 'its ETag: 304', headers: { ...AUTH, 'if-none-match': etag }, generatedId: true, status: 304 },
    { label: 'a list of tags, weak: 304', headers: { ...AUTH, 'if-none-match': `"other", W/${etag}` }, generatedId: true, status: 304 },
    { label: '*: 304', headers: { ...AUTH, 'if-none-match': '*' }, generatedId: true, status: 304 },
    { label: 'a stale tag: the list', headers: { ...AUTH, 'if-none-match': '"stale"' }, generatedId: true, status: 200 },
    { label: 'the balancer\'s request id', headers: { ...AUTH, 'x-request-id': 'lb-1234' }, generatedId: false, status: 200 },
    { label: 'an insane request id is replaced', headers: { ...AUTH, 'x-request-id': 'two words' }, generatedId: true, status: 200 }
  ]
  const before = { ok: await requests(app, 200), notModified: await requests(app, 304), cache: await metric(app, 'categories_list_reads_total', { source: 'cache' }) }
  const get = connection(t, port)
  t.equal((await get()).status, 200, 'the connection\'s first request: its key is remembered')
  let expectedAnswers = 0
  for (const { label, headers, generatedId, status } of cases) {
    const reference = await fresh(headers)
    const fast = await get(headers)
    expectedAnswers++
    t.equal(fast.status, status, `${label}: ${status}`)
    t.same(comparable(fast, generatedId), comparable(reference, generatedId), `${label}: the same status, headers in the same order, and body as Fastify's`)
    const id = header(fast, 'x-request-id') as string
    if (generatedId) t.match(id, UUID, `${label}: a generated request id`)
    else t.equal(id, headers['x-request-id'], `${label}: the request id echoed`)
    t.equal(await answered(app), expectedAnswers, `${label}: answered before Fastify`)
  }
  // The fast answers are in the metrics Fastify's requests are in.
  const twoHundreds = cases.filter(c => c.status === 200).length
  const fromFastify = cases.length + 1 // every reference, and the connection's first request
  const counted = { ok: await requests(app, 200), notModified: await requests(app, 304), cache: await metric(app, 'categories_list_reads_total', { source: 'cache' }) }
  t.equal(counted.ok - before.ok, 2 * twoHundreds + 1, 'every 200 is in the request histogram under the route')
  t.equal(counted.notModified - before.notModified, 2 * (cases.length - twoHundreds), 'every 304 too')
  t.equal(counted.cache - before.cache, cases.length + fromFastify, 'and every read of the cached list is counted')
})

t.test('what is left to Fastify', async t => {
  const { app, port } = await hearingApp(t)
  const get = connection(t, port)
  t.equal((await get()).status, 200)
  t.equal((await get()).status, 200)
  t.equal(await answered(app), 1, 'the second request was answered before Fastify')
  const stays = async (label: string, status: number, headers?: Record<string, string>, options?: { path?: string, method?: string }): Promise<Answer> => {
    const before = await answered(app)
    const answer = await get(headers, options)
    t.equal(answer.status, status, `${label}: ${status}`)
    t.equal(await answered(app), before, `${label}: through Fastify`)
    return answer
  }
  await stays('another valid key', 200, { authorization: `Bearer ${OTHER_KEY}` })
  await stays('the first key again, no longer the remembered header', 200)
  await stays('a query string', 200, AUTH, { path: '/v1/categories?x=1' })
  await stays('HEAD', 200, AUTH, { method: 'HEAD' })
  await stays('another route', 404, AUTH, { path: '/v1/categories/9' })

  // Created on this instance: the next read appends it (ListCache.created), through Fastify, and shows it at once.
  t.equal((await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name: 'new' }) })).statusCode, 201)
  const appended = await stays('own create waiting to be appended', 200)
  t.same(JSON.parse(appended.body).map((c: { name: string }) => c.name), ['new'], 'the new row is in the list at once')
  const before = await answered(app)
  t.same(JSON.parse((await get()).body).map((c: { name: string }) => c.name), ['new'], 'then the cached list has it')
  t.equal(await answered(app), before + 1, 'answered before Fastify again')

  app.lifecycle.shuttingDown = true
  const closing = await stays('shutting down', 200)
  t.equal(header(closing, 'connection'), 'close', 'with Connection: close, as Fastify sends while shutting down')
  app.lifecycle.shuttingDown = false

  // A new connection (the last one closed), its key remembered.
  t.equal((await get()).status, 200)
  t.equal((await get()).status, 200)
  t.equal(await answered(app), before + 2, 'answered before Fastify again')
  // A failed authentication from this address: every request goes through Fastify's limit for a window (RATE_LIMIT_WINDOW_MS).
  await stays('a wrong key', 401, { authorization: `Bearer ${TEST_KEY}x` })
  await stays('no key', 401, {})
  t.equal((await get()).status, 200)
  await stays('the remembered key, within the window of a failure', 200)
})

t.test('a repeated Authorization on a remembered connection is Fastify\'s 400', async t => {
  const { app, port } = await hearingApp(t)
  const socket = connect(port, '127.0.0.1')
  t.teardown(() => { socket.destroy() })
  let received = ''
  socket.on('data', (chunk: Buffer) => { received += chunk.toString('utf8') })
  const line = `Authorization: Bearer ${TEST_KEY}`
  const send = async (lines: string[], responses: number): Promise<string[]> => {
    received = ''
    socket.write(['GET /v1/categories HTTP/1.1', 'Host: localhost', ...lines, '', ''].join('\r\n'))
    const deadline = Date.now() + 5000
    while ((received.match(/HTTP\/1\.1 \d{3}/g) ?? []).length < responses || !/\r\n\r\n/.test(received)) {
      if (Date.now() > deadline) throw new Error(`no answer: ${received}`)
      await new Promise(resolve => setTimeout(resolve, 5))
    }
    await new Promise(resolve => setTimeout(resolve, 20))
    return received.match(/HTTP\/1\.1 \d{3}/g) ?? []
  }
  t.same(await send([line], 1), ['HTTP/1.1 200'])
  t.same(await send([line], 1), ['HTTP/1.1 200'])
  t.equal(await answered(app), 1, 'the remembered header: answered before Fastify')
  t.same(await send([line, line], 1), ['HTTP/1.1 400'], 'the same header twice: 400')
  t.match(received, /the Authorization header must be sent once/)
  t.same(await send([line, 'X-Request-Id: a', 'X-Request-Id: b'], 1), ['HTTP/1.1 400'], 'a request id twice: 400')
  t.equal(await answered(app), 1, 'neither answered before Fastify')
})

t.test('the failed-authentication limit refuses a remembered connection too', async t => {
  const { app, port } = await hearingApp(t, { RATE_LIMIT_AUTH_FAILURES: '2' })
  const get = connection(t, port)
  t.equal((await get()).status, 200)
  t.equal((await get()).status, 200)
  t.equal(await answered(app), 1)
  const guesser = connection(t, port)
  t.equal((await guesser({ authorization: 'Bearer wrong' })).status, 401, 'a failure from this address')
  t.equal((await get()).status, 200, 'under the limit, a valid key is served')
  t.equal((await guesser({ authorization: 'Bearer wrong' })).status, 401, 'a second failure reaches the limit of 2')
  t.equal((await get()).status, 429, 'then the remembered connection is refused too')
  t.equal(await answered(app), 1, 'none of them answered before Fastify: a failure was counted within the window')
})

t.test('a per-key limit, or a log line per request, keeps every request in Fastify', async t => {
  const settings: Array<Record<string, string>> = [{ RATE_LIMIT_PER_KEY_PER_MINUTE: '1000' }, { LOG_LEVEL: 'debug' }]
  for (const env of settings) {
    const label = Object.entries(env).map(([k, v]) => `${k}=${v}`).join('')
    const { app, port, logs } = await hearingApp(t, env)
    const get = connection(t, port)
    for (let i = 0; i < 3; i++) t.equal((await get()).status, 200, `${label}: 200`)
    t.equal(await answered(app), 0, `${label}: none answered before Fastify`)
    if (env.LOG_LEVEL === 'debug') t.equal(logs.lines.filter(line => line.includes('"request completed"') && line.includes('/v1/categories')).length, 3, 'a line per request')
  }
})

t.test('while Fastify closes (app.close(), with or without the shutdown signal), requests go to Fastify', async t => {
  let release = (): void => {}
  const held = new Promise<void>(resolve => { release = resolve })
  let closingStarted = false
  // A preClose hook of the test's own holds the close open (after the app's own preClose hooks, which run first).
  const { app, port } = await hearingApp(t, {}, {
    register: async app => { app.addHook('preClose', async () => { closingStarted = true; await held }) }
  })
  const get = connection(t, port)
  t.equal((await get()).status, 200)
  t.equal((await get()).status, 200)
  t.equal(await answered(app), 1, 'answered before Fastify while open')
  const closed = app.close()
  await until('the close has begun', async () => closingStarted)
  const during = await get()
  t.equal(during.status, 200, 'still served while closing')
  t.equal(header(during, 'connection'), 'close', 'with Fastify\'s Connection: close')
  t.equal(await answered(app), 1, 'through Fastify')
  release()
  await closed
})

t.test('only list routes without options of their own that Fastify must apply', async t => {
  const body = Buffer.from('[]')
  const resource = { cached: () => ({ body, etag: '"fixed"' }), list: async () => ({ body, etag: '"fixed"' }) }
  let hookRuns = 0
  const { app, port } = await hearingApp(t, {}, {
    register: async app => {
      app.get('/v1/plain-list', listHandler(resource))
      app.get('/v1/hooked-list', { onRequest: (_request, _reply, done) => { hookRuns++; done() } }, listHandler(resource))
      app.get('/v1/logged-list', { logLevel: 'debug' }, listHandler(resource))
      app.get('/v1/constrained-list', { constraints: { host: '127.0.0.1' } }, listHandler(resource))
    }
  })
  const get = connection(t, port)
  t.equal((await get(AUTH, { path: '/v1/plain-list' })).status, 200, 'the connection\'s first request')
  t.equal((await get(AUTH, { path: '/v1/plain-list' })).status, 200)
  t.equal(await answered(app), 1, 'a plain list route: answered before Fastify')
  for (const path of ['/v1/hooked-list', '/v1/logged-list', '/v1/constrained-list']) {
    t.equal((await get(AUTH, { path })).status, path === '/v1/constrained-list' ? 404 : 200, `${path}: answered by Fastify`)
    t.equal(await answered(app), 1, `${path}: not before Fastify`)
  }
  t.equal(hookRuns, 1, 'the route\'s own hook ran')
})

t.test('the app\'s request hooks are the ones cached-lists.ts stands in for', async t => {
  // A hook added to the app runs for every request through Fastify, and never for one answered before it.
  // A new one must be reproduced there (or make it step aside), and then named here.
  const { app } = await testApp(t, await db.createDatabase())
  const symbol = Object.getOwnPropertySymbols(app).find(s => s.description === 'fastify.hooks')
  if (symbol === undefined) throw new Error('Fastify keeps its hooks elsewhere now: find them for this test')
  const hooks = (app as unknown as Record<symbol, Record<string, Array<{ name: string }>>>)[symbol] ?? {}
  const perRequest = ['onRequest', 'preParsing', 'preValidation', 'preHandler', 'preSerialization', 'onSend', 'onResponse', 'onError', 'onTimeout', 'onRequestAbort']
  t.same(Object.fromEntries(perRequest.map(name => [name, (hooks[name] ?? []).map(hook => hook.name)])), {
    onRequest: ['refuseRepeatedHeaders', 'access'],
    preParsing: [],
    preValidation: [],
    preHandler: [],
    preSerialization: [],
    onSend: ['responseHeaders'],
    onResponse: ['requestCompleted'],
    onError: [],
    onTimeout: [],
    onRequestAbort: []
  })
})
