import { connect } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import t, { type Test } from 'tap'
import { TEST_KEY, listeningApp } from './helpers/app.js'
import { testDatabase } from './helpers/database.js'

/*
 * Every answer is ours, whatever layer produces it (docs/api.md, "HTTP itself"): Node's
 * parser, Node's server, Fastify's router and our hooks. Raw sockets, because an HTTP
 * client would refuse to send most of these requests.
 */

const db = await testDatabase(t)
const { port } = await listeningApp(t, db.url)

interface Answer { status: number, headers: Record<string, string>, body: string }

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
async function exchange (steps: Array<string | Buffer | number>, options: { head?: boolean } = {}): Promise<Answer[]> {
  const socket = connect(port, '127.0.0.1')
  const chunks: Buffer[] = []
  socket.on('data', chunk => { chunks.push(chunk) })
  socket.on('error', () => {})
  const closed = new Promise<boolean>(resolve => socket.once('close', () => { resolve(true) }))
  await new Promise<void>((resolve, reject) => { socket.once('connect', resolve); socket.once('error', reject) })
  for (const step of steps) {
    if (typeof step === 'number') await sleep(step)
    else socket.write(step)
  }
  // write, not end: Node's server drops a request whose client half-closes before the answer.
  const done = await Promise.race([closed, sleep(5000, false)])
  socket.destroy()
  if (!done) throw new Error(`the server kept the connection open; it sent ${JSON.stringify(Buffer.concat(chunks).toString('latin1'))}`)
  return responses(Buffer.concat(chunks), options.head === true)
}

const KEY = `Authorization: Bearer ${TEST_KEY}`
const CLOSE = 'Connection: close'

/** A request head: the request line, then each header line, then the blank line. */
const request = (line: string, ...headers: string[]): string => `${[line, ...headers].join('\r\n')}\r\n\r\n`

/** Exactly one answer, in the Error shape, with this status, code and message. */
function assertError (t: Test, answers: Answer[], status: number, code: string, message: string, label: string): Answer {
  t.equal(answers.length, 1, `${label}: one response`)
  const answer = answers[0] ?? { status: 0, headers: {}, body: '' }
  t.equal(answer.status, status, `${label}: ${status}`)
  t.equal(answer.headers['content-type'], 'application/json; charset=utf-8', `${label}: media type`)
  let body: unknown
  try { body = JSON.parse(answer.body) } catch { body = answer.body }
  t.same(body, { code, message, status }, `${label}: Error body`)
  return answer
}

t.test('an absolute-form target is its path: the key is still required under /v1', async t => {
  for (const target of ['http://x/v1/categories', 'HTTPS://x:443/v1/categories', 'http://x/v1/categories?a=1']) {
    assertError(t, await exchange([request(`GET ${target} HTTP/1.1`, 'Host: x', CLOSE)]), 401, 'UNAUTHORIZED',
      'an API key is required: send Authorization: Bearer <key>', target)
    const [answer] = await exchange([request(`GET ${target} HTTP/1.1`, 'Host: x', KEY, CLOSE)])
    t.equal(answer?.status, 200, `${target} with a key`)
    t.ok(Array.isArray(JSON.parse(answer?.body ?? '')), `${target}: the list`)
  }
  t.equal((await exchange([request('GET http://x HTTP/1.1', 'Host: x', CLOSE)]))[0]?.status, 404, 'http://x is /')
})

t.test('a percent-encoded letter in the path is the letter: /%761/categories needs the key too', async t => {
  for (const path of ['/%761/categories', '/%76%31/categories', '/v1/categori%65s', '/%76%31/categori%65s']) {
    assertError(t, await exchange([request(`GET ${path} HTTP/1.1`, 'Host: x', CLOSE)]), 401, 'UNAUTHORIZED',
      'an API key is required: send Authorization: Bearer <key>', path)
    t.equal((await exchange([request(`GET ${path} HTTP/1.1`, 'Host: x', KEY, CLOSE)]))[0]?.status, 200, `${path} with a key`)
  }
  // An encoded slash stays encoded, for the router too: one segment that is not /v1.
  assertError(t, await exchange([request('GET /v1%2Fcategories HTTP/1.1', 'Host: x', CLOSE)]), 404, 'NOT_FOUND',
    'no route for GET /v1%2Fcategories', 'an encoded slash')
})
