/*
 * The raw Node limit: what `node:http` alone costs for this API. No framework,
 * no database, no logging. GET checks the bearer header and writes a Buffer of
 * the same rows computed once (with its ETag, so If-None-Match gets a 304 as
 * cheaply as Node can send one); POST reads the body, JSON.parse, checks that
 * `name` is a non-empty string, takes an id from a counter and JSON.stringify.
 * Every server of the bench is measured against this.
 * CEILING_DATA names a JSON file of the rows (written by run.ts).
 */
import { createHash } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'

const env = process.env
const list = Buffer.from(readFileSync(env.CEILING_DATA ?? '', 'utf8'))
const etag = `"${createHash('sha1').update(list).digest('base64url')}"`
const authorized = new Set((env.API_KEYS ?? '').split(',').filter(k => k !== '').map(k => `Bearer ${k}`))
let nextId = (JSON.parse(list.toString()) as unknown[]).length + 1

const JSON_TYPE = 'application/json; charset=utf-8'

function send (res: ServerResponse, status: number, body: string): void {
  res.writeHead(status, { 'content-type': JSON_TYPE, 'content-length': Buffer.byteLength(body) })
  res.end(body)
}

function create (req: IncomingMessage, res: ServerResponse): void {
  const chunks: Buffer[] = []
  req.on('data', (chunk: Buffer) => chunks.push(chunk))
  req.on('end', () => {
    let input: { name?: unknown, description?: unknown }
    try { input = JSON.parse(Buffer.concat(chunks).toString()) } catch { send(res, 400, '{"code":"MALFORMED_JSON","message":"bad JSON","status":400}'); return }
    if (typeof input.name !== 'string' || input.name === '') { send(res, 400, '{"code":"VALIDATION_FAILED","message":"name","status":400}'); return }
    const id = nextId++
    const category = typeof input.description === 'string' ? { id, name: input.name, description: input.description } : { id, name: input.name }
    res.setHeader('location', `/v1/categories/${id}`)
    send(res, 201, JSON.stringify(category))
  })
}

const server = createServer((req, res) => {
  if (!authorized.has(req.headers.authorization ?? '')) {
    res.setHeader('www-authenticate', 'Bearer realm="petstore"')
    send(res, 401, '{"code":"UNAUTHORIZED","message":"missing or invalid API key","status":401}')
    return
  }
  if (req.url !== '/v1/categories') { send(res, 404, '{"code":"NOT_FOUND","message":"no route","status":404}'); return }
  if (req.method === 'POST') { create(req, res); return }
  if (req.headers['if-none-match'] === etag) {
    res.writeHead(304, { etag, 'cache-control': 'no-cache' })
    res.end()
    return
  }
  res.writeHead(200, { 'content-type': JSON_TYPE, 'content-length': list.length, etag, 'cache-control': 'no-cache' })
  res.end(list)
})

process.once('SIGTERM', () => { server.close(() => process.exit(0)); server.closeAllConnections() })
server.listen(Number(env.PORT ?? 3000), env.HOST ?? '127.0.0.1')
