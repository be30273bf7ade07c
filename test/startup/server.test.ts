import { mkdtemp, readFile, rm } from 'node:fs/promises'
import { request as httpRequest, Agent } from 'node:http'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { testDatabase } from '../helpers/database.js'
import { startServer } from '../helpers/server-process.js'

/*
 * The real process, as `npm start` and the container run it: real sockets,
 * real signals, real exit codes.
 */

function get (
  port: number,
  urlPath: string,
  agent?: Agent,
  headers: Record<string, string> = {}
): Promise<{ status: number; headers: Record<string, unknown>; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port, path: urlPath, agent, headers }, res => {
      let body = ''
      res.on('data', (d: Buffer) => {
        body += d.toString()
      })
      res.on('end', () => {
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body })
      })
    })
    req.on('error', reject)
    req.end()
  })
}

// Each process starts from an empty database of its own, on one server for the file.
const db = await testDatabase(t)

t.test(
  'SIGTERM: ready turns 503 at once, serving continues through the drain with Connection: close, ' +
    'then exit 0 despite a keep-alive client',
  async t => {
    const server = await startServer(t, {
      DATABASE_URL: await db.createDatabase(),
      API_KEYS: 'k',
      SHUTDOWN_DRAIN_MS: '1500'
    })
    const agent = new Agent({ keepAlive: true, maxSockets: 1 })
    t.teardown(() => {
      agent.destroy()
    })
    const auth = { authorization: 'Bearer k' }
    const before = await get(server.port, '/v1/categories', agent, auth)
    t.equal(before.status, 200)
    t.equal(before.headers.connection, 'keep-alive', 'a keep-alive connection is open and idle')

    // An in-flight POST whose body arrives after the signal must still complete.
    const inflight = new Promise<{ status: number; connection: unknown }>((resolve, reject) => {
      const req = httpRequest(
        {
          host: '127.0.0.1',
          port: server.port,
          path: '/v1/categories',
          method: 'POST',
          headers: { ...auth, 'content-type': 'application/json', 'content-length': '15' }
        },
        res => {
          res.resume()
          res.on('end', () => {
            resolve({ status: res.statusCode ?? 0, connection: res.headers.connection })
          })
        }
      )
      req.on('error', reject)
      req.write('{"name":')
      setTimeout(() => {
        req.end('"late"}')
      }, 700)
    })
    await sleep(100)
    const signalledAt = Date.now()
    server.child.kill('SIGTERM')
    t.ok(await server.waitFor('readiness is now 503'), 'the signal was handled')
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
  }
)

t.test('a second signal exits at once', async t => {
  const server = await startServer(t, {
    DATABASE_URL: await db.createDatabase(),
    API_KEYS: 'k',
    SHUTDOWN_DRAIN_MS: '30000'
  })
  server.child.kill('SIGTERM')
  t.ok(await server.waitFor('readiness is now 503'), 'the first signal was handled')
  const signalledAt = Date.now()
  server.child.kill('SIGTERM')
  const code = await server.exited
  t.ok(Date.now() - signalledAt < 3000, 'did not wait for the 30 s drain')
  t.not(code, 0, 'an interrupted shutdown is not a clean exit')
})

t.test(
  "a SIGINT relayed at once (npm run dev's watcher passes Ctrl-C on) is the same Ctrl-C: a clean exit",
  async t => {
    const server = await startServer(t, { DATABASE_URL: await db.createDatabase(), API_KEYS: 'k' })
    // Ctrl-C reaches the service and its watcher; the watcher relays it once the service has begun to stop.
    server.child.kill('SIGINT')
    t.ok(await server.waitFor('readiness is now 503'), 'the first SIGINT was handled')
    server.child.kill('SIGINT')
    t.equal(await server.exited, 0, 'exit code 0')
    t.match(server.output(), /shutdown complete/)
    t.notMatch(server.output(), /second SIGINT/, 'no error-level line')
  }
)

t.test(
  'no configuration at all (npm start on a bare machine): embedded PostgreSQL, a printed development key, ' +
    'data kept across restarts',
  async t => {
    const dataDir = await mkdtemp(path.join(tmpdir(), 'petstore-data-'))
    t.teardown(async () => {
      await rm(dataDir, { recursive: true, force: true })
    })
    const first = await startServer(t, { DATA_DIR: dataDir })
    const key = (await readFile(path.join(dataDir, 'dev-api-key'), 'utf8')).trim()
    t.ok(await first.waitFor(key), 'the key is printed')
    t.match(first.output(), /created a development API key/)
    const created = await new Promise<number>((resolve, reject) => {
      const req = httpRequest(
        {
          host: '127.0.0.1',
          port: first.port,
          path: '/v1/categories',
          method: 'POST',
          headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }
        },
        res => {
          res.resume()
          resolve(res.statusCode ?? 0)
        }
      )
      req.on('error', reject)
      req.end('{"name":"kept"}')
    })
    t.equal(created, 201)
    first.child.kill('SIGTERM')
    t.equal(await first.exited, 0)

    const second = await startServer(t, { DATA_DIR: dataDir })
    t.ok(await second.waitFor(key), 'and printed at every start')
    t.notMatch(
      second.output(),
      /created a development API key/,
      'the key is created once (the line that prints it has been read)'
    )
    const list = await get(second.port, '/v1/categories', undefined, { authorization: `Bearer ${key}` })
    t.equal(list.status, 200)
    t.same(
      JSON.parse(list.body).map((c: { name: string }) => c.name),
      ['kept'],
      'data survived the restart'
    )
    second.child.kill('SIGTERM')
    t.equal(await second.exited, 0)
  }
)
