import { randomUUID } from 'node:crypto'
import { STATUS_CODES, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import type { Socket } from 'node:net'
import type { FastifyInstance } from 'fastify'
import fp from 'fastify-plugin'
import { ApiError, errorForStatus, validationFailed } from './errors.js'
import { requestId } from './lifecycle.js'

// HTTP/1.1's own rules, answered in the Error shape (docs/api.md, "HTTP itself"). What Node cannot parse,
// and CONNECT, never reach Fastify: they get a complete response written to the socket.

const CLOSE = { connection: 'close' }
const NOT_HTTP = 'the request is not valid HTTP'
const REQUEST_LINE_START = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+ /
const REQUEST_LINE = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+ \S+ HTTP\/\d\.\d\r\n/
const HOST = /^(?:\[[0-9A-Fa-f:.]+\]|[\w\-.~!$&'()*+,;=%]+)(?::\d*)?$/
const ABSOLUTE_FORM = /^https?:\/\/[^/?#]*/i
const UNRESERVED = /%(?:[46][1-9A-Fa-f]|[57][0-9Aa]|3[0-9]|2[DEde]|5[Ff]|7[Ee])/g
// Headers RFC 9110 allows once and the service reads: sent twice, Node keeps one Authorization, Content-Type or Host
// and joins two Idempotency-Keys or X-Request-Ids, and a proxy in front may pick the other. docs/hardening.md.
const SINGLETONS = ['Authorization', 'Content-Type', 'Host', 'Idempotency-Key', 'X-Request-Id']
const SINGLETON_NAMES = SINGLETONS.map(name => name.toLowerCase())
const SINGLETON_LENGTHS = new Set(SINGLETONS.map(name => name.length))

// Fastify's rewriteUrl: absolute-form becomes its path, and unreserved characters are decoded
// (RFC 3986 6.2.2.2) as the router decodes them, so that checks on the path see what routing sees.
export function originForm (req: IncomingMessage): string {
  let target = req.url ?? ''
  const absolute = target.startsWith('/') ? null : ABSOLUTE_FORM.exec(target)
  if (absolute !== null) target = `/${target.slice(absolute[0].length).replace(/^\//, '')}`
  if (!target.includes('%')) return target
  const query = target.indexOf('?')
  const path = query === -1 ? target : target.slice(0, query)
  return path.replace(UNRESERVED, hex => String.fromCharCode(parseInt(hex.slice(1), 16))) + target.slice(path.length)
}

const unsupportedVersion = (): ApiError => errorForStatus(505, 'only HTTP/1.0 and HTTP/1.1 are supported', CLOSE)

export function protocolError (req: IncomingMessage): ApiError | undefined {
  if (req.httpVersionMajor !== 1) return unsupportedVersion()
  const { host, expect, 'transfer-encoding': transferEncoding } = req.headers
  if (host === undefined && req.httpVersionMinor === 1) return validationFailed('the Host header is required')
  if (host !== undefined && !HOST.test(host)) {
    return validationFailed('the Host header must be a host name or address and an optional port')
  }
  if (transferEncoding !== undefined) {
    const codings = transferEncoding.toLowerCase().split(',').map(coding => coding.trim())
    if (req.httpVersionMinor === 0) return errorForStatus(400, 'Transfer-Encoding is not allowed in HTTP/1.0', CLOSE)
    if (codings.at(-1) !== 'chunked') return errorForStatus(400, 'Transfer-Encoding must end with chunked', CLOSE)
    if (codings.length > 1) return errorForStatus(501, 'the only transfer coding supported is chunked', CLOSE)
  }
  if (expect?.split(',').some(member => member.trim().toLowerCase() !== '100-continue') === true) {
    return errorForStatus(417, 'the only expectation supported is 100-continue')
  }
  if (req.url?.startsWith('/') !== true) {
    return req.method === 'OPTIONS' && req.url === '*'
      ? new ApiError(405, 'METHOD_NOT_ALLOWED', 'OPTIONS * is not supported: send requests to a path', { allow: '' })
      : validationFailed('the request target must be a path')
  }
  return undefined
}

function repeatedSingleton (rawHeaders: string[]): ApiError | undefined {
  let seen = 0 // bit j: SINGLETON_NAMES[j] was sent
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const raw = rawHeaders[i] as string
    // Every request pays for this loop: most names are ruled out by their length, without lowercasing.
    if (!SINGLETON_LENGTHS.has(raw.length)) continue
    const j = SINGLETON_NAMES.indexOf(raw.toLowerCase())
    if (j === -1) continue
    if ((seen & (1 << j)) !== 0) return validationFailed(`the ${SINGLETONS[j]} header must be sent once`)
    seen |= 1 << j
  }
  return undefined
}

function writeRawError (socket: Socket, error: ApiError, id: string = randomUUID()): void {
  const body = JSON.stringify(error.toBody())
  const head = [`HTTP/1.1 ${error.status} ${STATUS_CODES[error.status] ?? ''}`, `Date: ${new Date().toUTCString()}`,
    'Content-Type: application/json; charset=utf-8', `Content-Length: ${Buffer.byteLength(body)}`,
    `X-Request-Id: ${id}`, 'Connection: close']
  if (socket.writable) socket.end(`${head.join('\r\n')}\r\n\r\n${body}`, () => socket.destroy())
  else socket.destroy()
}

interface ClientError extends Error { code?: string, rawPacket?: unknown, bytesParsed?: number }

// From the start of the line Node's parser stopped in: a packet may hold several requests.
function lineAtError (err: ClientError): string {
  const packet = Buffer.isBuffer(err.rawPacket) ? err.rawPacket.toString('latin1') : ''
  const at = Math.min(err.bytesParsed ?? 0, packet.length)
  return packet.slice(packet.lastIndexOf('\n', at - 1) + 1)
}

function clientError (err: ClientError): ApiError {
  const requestLine = REQUEST_LINE.test(lineAtError(err))
  switch (err.code) {
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      return errorForStatus(408, 'the request took too long to arrive')
    case 'HPE_HEADER_OVERFLOW':
      // Node counts the request line with the headers: overflowing before its end is a long URL.
      return REQUEST_LINE_START.test(lineAtError(err))
        ? errorForStatus(414, 'the request URL is too long')
        : errorForStatus(431, 'request headers are too large')
    case 'HPE_INVALID_METHOD':
      return requestLine ? errorForStatus(501, 'the request method is not implemented') : validationFailed(NOT_HTTP)
    case 'HPE_INVALID_VERSION':
      return requestLine ? unsupportedVersion() : validationFailed(NOT_HTTP)
    case 'HPE_PAUSED_H2_UPGRADE':
      return unsupportedVersion()
    default:
      return validationFailed(NOT_HTTP)
  }
}

// Each connection's latest response: a parse error must neither cut in before it nor add a second one.
const answering = new WeakMap<Socket, ServerResponse>()
const refused = new WeakSet<Socket>()

export function clientErrorHandler (err: ClientError, socket: Socket): void {
  // Bytes that arrive while an answer waits its turn fail to parse again: one answer is enough.
  if (err.code === 'ECONNRESET' || socket.destroyed || refused.has(socket)) return
  refused.add(socket)
  const res = answering.get(socket)
  const answer = (): void => { writeRawError(socket, clientError(err)) }
  if (res === undefined || (!res.req.complete && !res.headersSent)) {
    answer()
    return
  }
  // The next request in the pipeline is bad: its answer follows the one before. A bad body after its request
  // was answered (a 401 before the body is read): close, no second answer.
  const afterIt = (): void => {
    if (res.req.complete) answer()
    else socket.destroy()
  }
  if (res.writableFinished) afterIt()
  else res.once('close', afterIt)
}

// Node's own answers, in our shape: `route` serves a request whose expectation Node would refuse bare.
export function answerServerEvents (server: Server, route: (req: IncomingMessage, res: ServerResponse) => void): void {
  server.on('request', (req, res) => { answering.set(req.socket, res) })
  // Node answers an unknown expectation with a bare 417 unless this event has a listener.
  server.on('checkExpectation', (req, res) => {
    answering.set(req.socket, res)
    route(req, res)
  })
  // Without a listener Node closes the socket unanswered.
  server.on('connect', (req, socket: Socket) => {
    writeRawError(socket, errorForStatus(501, 'CONNECT is not supported: this service is not a proxy'), requestId(req))
  })
}

// After CORS: a page can read these answers too.
export default fp(async function protocol (app: FastifyInstance): Promise<void> {
  answerServerEvents(app.server, (req, res) => { app.routing(req, res) })
  // Repeated headers before the failed-authentication limit: their 400 is the same whatever the keys are.
  app.addHook('onRequest', function httpRules (request, _reply, done) {
    done(protocolError(request.raw) ?? repeatedSingleton(request.raw.rawHeaders))
  })
}, { name: 'protocol', dependencies: ['cors'] })
