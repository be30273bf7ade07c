import { randomBytes } from 'node:crypto'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import newman from 'newman'
import { startServer } from '../test/helpers/server-process.js'
import { until } from '../test/helpers/until.js'

/*
 * npm run test:postman
 * The Postman collection users download (/docs/petstore.postman_collection.json), run by Newman against a live
 * instance: src/server.ts as `npm run dev` starts it, on the embedded PostgreSQL in a data directory of its own.
 * The collection is fetched from that instance: what is served is what runs. Every assertion must pass.
 */

// The setting's maximum: the collection fails authentication twice per operation ([NoKey], [WrongKey]), and the
// default 20 a minute would answer 429 to the rest of a run past ten operations.
const AUTH_FAILURES_ALLOWED = '1000000'
/** The embedded PostgreSQL's first start (initdb, migrations) comes before ready. */
const READY_TIMEOUT_MS = 90_000
const READY_POLL_MS = 500

const key = `postman-${randomBytes(16).toString('hex')}`
const dataDir = await mkdtemp(path.join(tmpdir(), 'petstore-postman-'))
const teardowns: Array<() => Promise<void> | void> = []

try {
  const server = await startServer(
    { teardown: fn => teardowns.push(fn) },
    { HOST: '127.0.0.1', DATA_DIR: dataDir, API_KEYS: key, RATE_LIMIT_AUTH_FAILURES: AUTH_FAILURES_ALLOWED },
    { cwd: process.cwd(), nodeArgs: ['--import', 'tsx', 'src/server.ts'] }
  )
  const base = `http://127.0.0.1:${server.port}`
  const ready = async (): Promise<boolean> => {
    if (server.child.exitCode !== null) {
      throw new Error(`the server exited (${server.child.exitCode}) before it was ready:\n${server.output()}`)
    }
    const res = await fetch(`${base}/health/ready`).catch(() => undefined)
    return res?.status === 200
  }
  await until('the server is ready', ready, READY_TIMEOUT_MS, READY_POLL_MS).catch((err: unknown) => {
    throw new Error(`${(err as Error).message}; its output:\n${server.output()}`, { cause: err })
  })
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
  for (const teardown of teardowns) await teardown()
  await rm(dataDir, { recursive: true, force: true })
}
