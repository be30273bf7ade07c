import { spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { mkdtemp, readFile, rm } from 'node:fs/promises'
import { request as httpRequest, Agent } from 'node:http'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { freePort } from '../src/db/embedded.js'
import { testDatabase } from './helpers/database.js'

/*
 * The real process, as `npm start` and the container run it: real sockets,
 * real signals, real exit codes.
 */

interface Server { child: ChildProcess, port: number, output: () => string, exited: Promise<number | null> }

async function startServer (env: Record<string, string>): Promise<Server> {
  const port = await freePort()
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
    env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', PORT: String(port), METRICS_PORT: '0', LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  let output = ''
  child.stdout?.on('data', (d: Buffer) => { output += d.toString() })
  child.stderr?.on('data', (d: Buffer) => { output += d.toString() })
  const exited = once(child, 'exit').then(([code]) => code as number | null)
  t.teardown(() => { if (child.exitCode === null) child.kill('SIGKILL') })
  const deadline = Date.now() + 60000
  while (!output.includes('Server listening')) {
    if (child.exitCode !== null) break
    if (Date.now() > deadline) throw new Error(`server did not start:\n${output}`)
    await sleep(50)
  }
  return { child, port, output: () => output, exited }
}

function get (port: number, urlPath: string, agent?: Agent, headers: Record<string, string> = {}): Promise<{ status: number, headers: Record<string, unknown>, body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port, path: urlPath, agent, headers }, res => {
      let body = ''
      res.on('data', (d: Buffer) => { body += d.toString() })
      res.on('end', () => { resolve({ status: res.statusCode ?? 0, headers: res.headers, body }) })
    })
    req.on('error', reject)
    req.end()
  })
}

t.test('SIGTERM: ready turns 503 at once, serving continues through the drain with Connection: close, then exit 0 despite a keep-alive client', async t => {
  const db = await testDatabase(t)
  const server = await startServer({ DATABASE_URL: db.url, API_KEYS: 'k', SHUTDOWN_DRAIN_MS: '1500' })
  const agent = new Agent({ keepAlive: true, maxSockets: 1 })
  t.teardown(() => { agent.destroy() })
  const auth = { authorization: 'Bearer k' }
  const before = await get(server.port, '/v1/categories', agent, auth)
  t.equal(before.status, 200)
  t.equal(before.headers.connection, 'keep-alive', 'a keep-alive connection is open and idle')

  // An in-flight POST whose body arrives after the signal must still complete.
  const inflight = new Promise<{ status: number, connection: unknown }>((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port: server.port, path: '/v1/categories', method: 'POST', headers: { ...auth, 'content-type': 'application/json', 'content-length': '15' } }, res => {
      res.resume()
      res.on('end', () => { resolve({ status: res.statusCode ?? 0, connection: res.headers.connection }) })
    })
    req.on('error', reject)
    req.write('{"name":')
    setTimeout(() => { req.end('"late"}') }, 700)
  })
  await sleep(100)
  const signalledAt = Date.now()
  server.child.kill('SIGTERM')
  await sleep(200)
  const ready = await get(server.port, '/health/ready')
  t.equal(ready.status, 503, 'ready is 503 during the drain')
  t.equal(JSON.parse(ready.body).code, 'SERVICE_UNAVAILABLE')
  const during = await get(server.port, '/v1/categories', agent, auth)
  t.equal(during.status, 200, 'still serving during the drain')
  t.equal(during.headers.connection, 'close', 'responses after the signal carry Connection: close')
  const done = await inflight
  t.equal(done.status, 201, 'the in-flight request completed')
  const code = await server.exited
  const took = Date.now() - signalledAt
  t.equal(code, 0, 'exit code 0')
  t.ok(took < 1500 + 5000, `exited ${took} ms after SIGTERM (drain 1500 ms), not after the 72 s keep-alive timeout`)
  t.match(server.output(), /shutdown complete/)
})

t.test('a second signal exits at once', async t => {
  const db = await testDatabase(t)
  const server = await startServer({ DATABASE_URL: db.url, API_KEYS: 'k', SHUTDOWN_DRAIN_MS: '30000' })
  server.child.kill('SIGTERM')
  await sleep(300)
  const signalledAt = Date.now()
  server.child.kill('SIGTERM')
  const code = await server.exited
  t.ok(Date.now() - signalledAt < 3000, 'did not wait for the 30 s drain')
  t.not(code, 0, 'an interrupted shutdown is not a clean exit')
})

t.test('production without configuration refuses to start, naming what is missing', async t => {
  const server = await startServer({ NODE_ENV: 'production' })
  t.equal(await server.exited, 1)
  t.match(server.output(), /NODE_ENV=production requires DATABASE_URL and API_KEYS or API_KEY_SHA256/)
  const partial = await startServer({ NODE_ENV: 'production', DATABASE_URL: 'postgres://127.0.0.1:1/x' })
  t.equal(await partial.exited, 1)
  t.match(partial.output(), /requires API_KEYS or API_KEY_SHA256/)
})

t.test('no configuration at all (npm start on a bare machine): embedded PostgreSQL, a printed development key, data kept across restarts', async t => {
  const dataDir = await mkdtemp(path.join(tmpdir(), 'petstore-data-'))
  t.teardown(async () => { await rm(dataDir, { recursive: true, force: true }) })
  const first = await startServer({ DATA_DIR: dataDir })
  const key = (await readFile(path.join(dataDir, 'dev-api-key'), 'utf8')).trim()
  t.match(first.output(), key, 'the key is printed')
  t.match(first.output(), /created a development API key/)
  const created = await new Promise<number>((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port: first.port, path: '/v1/categories', method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' } }, res => { res.resume(); resolve(res.statusCode ?? 0) })
    req.on('error', reject)
    req.end('{"name":"kept"}')
  })
  t.equal(created, 201)
  first.child.kill('SIGTERM')
  t.equal(await first.exited, 0)

  const second = await startServer({ DATA_DIR: dataDir })
  t.notMatch(second.output(), /created a development API key/, 'the key is created once')
  t.match(second.output(), key, 'and printed at every start')
  const list = await get(second.port, '/v1/categories', undefined, { authorization: `Bearer ${key}` })
  t.equal(list.status, 200)
  t.same(JSON.parse(list.body).map((c: { name: string }) => c.name), ['kept'], 'data survived the restart')
  second.child.kill('SIGTERM')
  t.equal(await second.exited, 0)
})
