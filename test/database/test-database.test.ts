import { readFile } from 'node:fs/promises'
import pg from 'pg'
import t from 'tap'
import { SERVER_URL_VARIABLE, testDatabase } from '../helpers/database.js'
import {
  CONTAINER_LABEL,
  DEFAULT_POSTGRES_IMAGE,
  decideSource,
  startPostgresContainer,
  type RuntimeProbe
} from '../helpers/postgres-server.js'

/*
 * The suite's PostgreSQL: chosen explicitly, said out loud, and really the one in use.
 */

const runtimeDescription = 'a container runtime answers at /var/run/docker.sock'
const answers = async (): Promise<RuntimeProbe> => ({ answers: true, description: runtimeDescription })
const none = async (): Promise<RuntimeProbe> => ({ answers: false, error: 'connect ENOENT /var/run/docker.sock' })
const unasked = async (): Promise<RuntimeProbe> => {
  throw new Error('the container runtime was probed although the environment had decided')
}

// Before the first subtest: a subtest that finishes while the file still awaits ends the file's test (see below).
const db = await testDatabase(t)

t.test(
  'the source is what the user asked for, else testcontainers when a runtime answers, else embedded; ' +
    'always with the reason',
  async t => {
    t.match(await decideSource({ DATABASE_URL: 'postgres://u:p@db.example/x' }, unasked), {
      source: 'DATABASE_URL',
      reason: 'DATABASE_URL is set',
      target: 'postgres://u:p@db.example/x'
    })
    t.match(await decideSource({ TEST_DATABASE: 'embedded', DATABASE_URL: 'postgres://u:p@db.example/x' }, unasked), {
      source: 'embedded',
      reason: 'TEST_DATABASE=embedded (DATABASE_URL is ignored)'
    })
    t.match(await decideSource({}, answers), {
      source: 'testcontainers',
      target: DEFAULT_POSTGRES_IMAGE,
      reason: runtimeDescription
    })
    t.match(await decideSource({ TEST_POSTGRES_IMAGE: 'postgres:18' }, answers), {
      source: 'testcontainers',
      target: 'postgres:18'
    })
    t.match(await decideSource({}, none), {
      source: 'embedded',
      reason: /^no container runtime answers \(connect ENOENT \/var\/run\/docker.sock\)/
    })
    t.match(await decideSource({ TEST_DATABASE: 'testcontainers', DATABASE_URL: 'postgres://x' }, answers), {
      source: 'testcontainers',
      reason: /^TEST_DATABASE=testcontainers \(DATABASE_URL is ignored\)/
    })
    await t.rejects(
      decideSource({ TEST_DATABASE: 'testcontainers' }, none),
      /TEST_DATABASE=testcontainers, but no container runtime answers: connect ENOENT/,
      'asked for containers without a runtime: an error, not the embedded server'
    )
    await t.rejects(
      decideSource({ TEST_DATABASE: 'docker' }, unasked),
      /TEST_DATABASE must be one of testcontainers, embedded \(or unset\), got "docker"/
    )
  }
)

t.test('the default image is the one docker-compose.yml runs, so the tests run what users run', async t => {
  const compose = await readFile(new URL('../../docker-compose.yml', import.meta.url), 'utf8')
  t.match(compose, new RegExp(`^\\s+image: ${DEFAULT_POSTGRES_IMAGE}$`, 'm'))
})

t.test('a database asked for after the test ended is an error, and none is left behind', async t => {
  // A file whose first subtest ends while it awaits testDatabase(t) at the top level has ended: tap runs its
  // teardown at once, and every later subtest is dropped with no failure ("cannot create subtest after parent
  // test ends"). This file did that, which left its two later tests unrun and its database on the server.
  const ended = {
    teardown: (fn: () => Promise<void> | void) => {
      fn()?.catch(err => {
        t.error(err)
      })
    },
    comment: () => {}
  }
  // On this file's server, as under npm test, where a database left behind stays until someone drops it.
  const shared = process.env[SERVER_URL_VARIABLE]
  process.env[SERVER_URL_VARIABLE] = Object.assign(new URL(db.adminUrl), { pathname: '/postgres' }).toString()
  t.teardown(() => {
    if (shared === undefined) delete process.env[SERVER_URL_VARIABLE]
    else process.env[SERVER_URL_VARIABLE] = shared
  })
  const error = await testDatabase(ended).then(
    () => undefined,
    (err: Error) => err
  )
  t.match(
    error?.message,
    new RegExp('^petstore_test_[0-9a-f]{12}: the test ended before its database was ready: ' +
      "await testDatabase\\(t\\) before the file's first subtest$")
  )
  // Other files make and drop their databases on this server meanwhile: only the one named is looked for.
  const name = error?.message.split(':')[0] ?? ''
  const client = new pg.Client({ connectionString: db.adminUrl })
  await client.connect()
  t.teardown(async () => {
    await client.end()
  })
  t.equal(
    (await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [name])).rowCount,
    0,
    `${name} is not left behind`
  )
  t.equal((await client.query('SELECT 1 FROM pg_roles WHERE rolname = $1', [name])).rowCount, 0, 'nor its role')
})

t.test("this file's database is on the server the run announced, owned by a role that is no superuser", async t => {
  const owner = new pg.Client({ connectionString: db.url })
  await owner.connect()
  t.teardown(async () => {
    await owner.end()
  })
  const {
    rows: [role]
  } = await owner.query<{ name: string; superuser: boolean; owner: string }>(
    `SELECT current_user AS name, rolsuper AS superuser, pg_get_userbyid(datdba) AS owner
     FROM pg_roles, pg_database WHERE rolname = current_user AND datname = current_database()`
  )
  t.same(
    role,
    { name: role?.owner, superuser: false, owner: role?.owner },
    'as the service connects: a role of its own'
  )
  const client = new pg.Client({ connectionString: db.adminUrl })
  await client.connect()
  t.teardown(async () => {
    await client.end()
  })
  const {
    rows: [server]
  } = await client.query<{ version: string; database: string; dataDirectory: string }>(
    'SELECT version(), current_database() AS database, current_setting(\'data_directory\') AS "dataDirectory"'
  )
  t.match(server?.database, /^petstore_test_[0-9a-f]{12}$/, 'a database of its own')
  if (db.source === 'DATABASE_URL') {
    t.equal(new URL(db.url).host, new URL(process.env.DATABASE_URL ?? '').host, "on DATABASE_URL's server")
    return
  }
  t.match(server?.version, /^PostgreSQL 18\./)
  if (db.source === 'embedded') {
    t.match(server?.dataDirectory, /petstore-test-pg-/, "in the embedded server's temporary directory")
    return
  }
  t.equal(server?.dataDirectory, '/var/lib/postgresql/18/docker', "in the image's PGDATA")
  const { getContainerRuntimeClient } = await import('testcontainers')
  const running = await (await getContainerRuntimeClient()).container.list()
  const port = Number(new URL(db.url).port)
  t.ok(
    running.some(c => c.Labels[CONTAINER_LABEL] !== undefined && c.Ports.some(p => p.PublicPort === port)),
    `a running container labelled ${CONTAINER_LABEL} publishes port ${port}`
  )
})

const needsContainers = db.source === 'testcontainers' ? false : `needs a container runtime; this run uses ${db.source}`
t.test(
  'a container that is created but cannot start is removed, and its real error fails the start',
  { skip: needsContainers },
  async t => {
    const { getContainerRuntimeClient } = await import('testcontainers')
    const { dockerode } = (await getContainerRuntimeClient()).container
    const ours = async (): Promise<string[]> =>
      (await dockerode.listContainers({ all: true, filters: { label: [CONTAINER_LABEL] } })).map(
        c => `${c.Id.slice(0, 12)} ${c.State}`
      )
    const before = await ours()
    const image = process.env.TEST_POSTGRES_IMAGE ?? DEFAULT_POSTGRES_IMAGE
    await t.rejects(
      startPostgresContainer(image, { entrypoint: ['/no/such/entrypoint'] }),
      new RegExp(`testcontainers could not start ${image}: .*no such file or directory`)
    )
    t.same(await ours(), before, 'no container is left behind, running or not')
  }
)
