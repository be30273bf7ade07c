// PostgreSQL for scripts/test-cluster.sh (through scripts/fresh-database.sh).
//
//   node scripts/test-postgres.mjs create NAME   -> prints the URL of a new, empty database
//        NAME on the server in ADMIN_DATABASE_URL (default: the machine's
//        postgres://postgres@127.0.0.1:5432/postgres). Exit 3 when that server does not answer.
//   node scripts/test-postgres.mjs drop URL       -> drops the database in URL (best effort)
//   node --import tsx scripts/test-postgres.mjs embedded DIR PORT
//        -> runs the embedded PostgreSQL (@petstore/embedded-postgres) in DIR on 127.0.0.1:PORT, prints
//           "ready URL" on stdout once it accepts connections, stops it on SIGTERM/SIGINT.
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
  // The service's own embedded PostgreSQL (packages/embedded-postgres): it runs as any user in any
  // directory and never writes its password where another user can read it.
  const { startEmbeddedPostgres } = await import('@petstore/embedded-postgres')
  const server = await startEmbeddedPostgres({ dir, port: Number(port) })
  let stopping = false
  const stop = async () => {
    if (stopping) return
    stopping = true
    // A throwaway cluster: deleted with its server (as root it may live outside DIR).
    await server.destroy().catch(() => {})
    process.exit(0)
  }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
  console.log(`ready ${server.url}`)
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
