// The container checks of scripts/test-container.sh, through testcontainers, for machines
// where a Docker engine answers (not the build machines here, which have podman only).
//
//   node scripts/test-container-testcontainers.mjs        (or TESTCONTAINERS=1 npm run test:container)
//
// Builds the image with GenericContainer.fromDockerfile, starts postgres:18 beside it on a
// private network, and checks: non-root user, /health/ready 200, create + list, and that
// SIGTERM (container stop) ends the process with exit code 0 well inside the grace period.
import path from 'node:path'
import process from 'node:process'
import { fileURLToPath } from 'node:url'
import { GenericContainer, Network, Wait, getContainerRuntimeClient } from 'testcontainers'
import { PostgreSqlContainer } from '@testcontainers/postgresql'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const key = `tc-${Date.now()}`
const graceMs = 30_000
let failures = 0
const check = (ok, label) => { console.log(`  ${ok ? 'ok  ' : 'FAIL'} ${label}`); if (!ok) failures++ }

const network = await new Network().start()
const db = await new PostgreSqlContainer('postgres:18-bookworm').withNetwork(network).withNetworkAliases('db').start()
let api
try {
  const image = await GenericContainer.fromDockerfile(root).build('petstore-testcontainers:test', { deleteOnExit: true })
  api = await image
    .withNetwork(network)
    .withEnvironment({
      DATABASE_URL: `postgres://${db.getUsername()}:${db.getPassword()}@db:5432/${db.getDatabase()}`,
      API_KEYS: key
    })
    .withExposedPorts(3000)
    .withWaitStrategy(Wait.forHttp('/health/ready', 3000).forStatusCode(200))
    .withStartupTimeout(60_000)
    .start()
  const base = `http://${api.getHost()}:${api.getMappedPort(3000)}`

  const { output: uid } = await api.exec(['id', '-u'])
  check(uid.trim() !== '0', `runs as uid ${uid.trim()} (non-root)`)
  check((await fetch(`${base}/health/ready`)).status === 200, '/health/ready 200')
  const auth = { authorization: `Bearer ${key}` }
  const created = await fetch(`${base}/v1/categories`, {
    method: 'POST', headers: { ...auth, 'content-type': 'application/json' }, body: JSON.stringify({ name: 'testcontainers' })
  })
  const body = await created.json()
  check(created.status === 201 && created.headers.get('location') === `/v1/categories/${body.id}`, `POST 201 id=${body.id}`)
  const list = await (await fetch(`${base}/v1/categories`, { headers: auth })).json()
  check(list.some((c) => c.id === body.id), 'GET lists it')

  const t0 = Date.now()
  await api.stop({ timeout: graceMs, remove: false }) // SIGTERM, SIGKILL after the timeout
  const elapsed = Date.now() - t0
  const client = await getContainerRuntimeClient()
  const info = await client.container.inspect(client.container.getById(api.getId()))
  check(info.State.ExitCode === 0 && elapsed < graceMs, `SIGTERM: exit code ${info.State.ExitCode} after ${elapsed} ms`)
  await client.container.remove(client.container.getById(api.getId()), { removeVolumes: true }).catch(() => {})
  api = undefined
} finally {
  await api?.stop({ timeout: 1000 }).catch(() => {})
  await db.stop()
  await network.stop()
}
console.log(`testcontainers: ${failures} failure(s)`)
process.exit(failures === 0 ? 0 : 1)
