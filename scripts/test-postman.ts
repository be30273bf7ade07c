import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import newman from 'newman'

/*
 * npm run test:postman
 * The Postman collection users download (/docs/petstore.postman_collection.json), run by
 * Newman against a live instance: src/server.ts as `npm run dev` starts it, on the embedded
 * PostgreSQL in a data directory of its own, on a loopback port (POSTMAN_TEST_PORT, 43010 by
 * default). The collection is fetched from that instance: what is served is what runs.
 * Every assertion must pass.
 */

const port = Number(process.env.POSTMAN_TEST_PORT ?? '43010')
const base = `http://127.0.0.1:${port}`
const key = `postman-${randomBytes(16).toString('hex')}`
const dataDir = await mkdtemp(path.join(tmpdir(), 'petstore-postman-'))
let output = ''

// The setting's maximum: the collection fails authentication twice per operation ([NoKey], [WrongKey]), and the
// default 20 a minute would answer 429 to the rest of a run past ten operations.
const AUTH_FAILURES_ALLOWED = '1000000'

const server = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
  env: {
    PATH: process.env.PATH,
    HOME: process.env.HOME,
    HOST: '127.0.0.1',
    PORT: String(port),
    METRICS_PORT: '0',
    DATA_DIR: dataDir,
    API_KEYS: key,
    LOG_LEVEL: 'warn',
    RATE_LIMIT_AUTH_FAILURES: AUTH_FAILURES_ALLOWED
  },
  stdio: ['ignore', 'pipe', 'pipe']
})
server.stdout.on('data', (chunk: Buffer) => {
  output += chunk.toString()
})
server.stderr.on('data', (chunk: Buffer) => {
  output += chunk.toString()
})
const exited = once(server, 'exit')

async function stop (): Promise<void> {
  if (server.exitCode === null && server.signalCode === null) {
    server.kill('SIGTERM')
    await exited
  }
  await rm(dataDir, { recursive: true, force: true })
}

async function ready (): Promise<void> {
  const deadline = Date.now() + 90_000
  while (Date.now() < deadline) {
    if (server.exitCode !== null) {
      throw new Error(`the server exited (${server.exitCode}) before it was ready:\n${output}`)
    }
    const res = await fetch(`${base}/health/ready`).catch(() => undefined)
    if (res?.status === 200) return
    await sleep(500)
  }
  throw new Error(`the server was not ready within 90 s:\n${output}`)
}

try {
  await ready()
  const res = await fetch(`${base}/docs/petstore.postman_collection.json`)
  if (res.status !== 200) throw new Error(`GET /docs/petstore.postman_collection.json answered ${res.status}`)
  const collection = (await res.json()) as object
  const summary = await new Promise<newman.NewmanRunSummary>((resolve, reject) => {
    newman.run(
      {
        collection,
        envVar: [
          { key: 'baseUrl', value: `${base}/v1` },
          { key: 'bearerToken', value: key }
        ],
        reporters: 'cli',
        reporter: { cli: { noColor: true } }
      },
      (err, result) => {
        if (err !== null && err !== undefined) reject(err)
        else resolve(result)
      }
    )
  })
  const { assertions, requests } = summary.run.stats
  const failures = summary.run.failures.length
  const failed = assertions.failed ?? 0
  console.log(`newman: ${requests.total ?? 0} requests, ${assertions.total ?? 0} assertions, ` +
    `${failed} failed assertions, ${failures} failures`)
  if (failures > 0 || failed > 0 || (assertions.total ?? 0) === 0) process.exitCode = 1
} catch (err) {
  console.error(err)
  process.exitCode = 1
} finally {
  await stop()
}
