import { once } from 'node:events'
import { createServer } from 'node:net'
import pg from 'pg'
import { StartupError } from './startup-error.js'

// Each failure is one line naming the setting to change; the driver's or system's error stays in the cause.

type PortSetting = 'PORT' | 'METRICS_PORT'

export function listenFailed (setting: PortSetting, host: string, port: number): (err: unknown) => never {
  const hostSetting = setting === 'PORT' ? 'HOST' : 'METRICS_HOST'
  const off = setting === 'METRICS_PORT' ? ', or 0 to turn metrics off' : ''
  const unresolved = `${hostSetting} ${host} cannot be resolved to an address; ` +
    `set ${hostSetting} to an address of this machine`
  const byCode: Record<string, string> = {
    EADDRINUSE: `${setting} ${port} is already in use on ${host} (another process listens there); ` +
      `set ${setting} to a free port${off}`,
    EACCES: `${setting} ${port} on ${host} needs privileges this user lacks; ` +
      `set ${setting} to a port above 1023${off}`,
    EADDRNOTAVAIL: `${hostSetting} ${host} is not an address of this machine; ` +
      `set ${hostSetting} to one of its addresses (127.0.0.1, 0.0.0.0, ...)`,
    ENOTFOUND: unresolved,
    EAI_AGAIN: unresolved
  }
  return (err) => {
    const other = `cannot listen on ${host}:${port} (${setting}, ${hostSetting}): ${(err as Error).message}`
    throw new StartupError(byCode[(err as NodeJS.ErrnoException).code ?? ''] ?? other, { cause: err })
  }
}

/** Fails before any slow step (port 0 picks a free one: nothing to check). */
export async function checkPortFree (setting: PortSetting, host: string, port: number): Promise<void> {
  if (port === 0) return
  const server = createServer().listen(port, host)
  await once(server, 'listening').catch(listenFailed(setting, host, port))
  await new Promise(resolve => server.close(resolve))
}

/** Never the password. */
function target (url: string): { where: string, user: string, database: string } {
  try {
    const u = new URL(url)
    const host = u.searchParams.get('host') ?? (u.hostname === '' ? 'localhost' : u.hostname)
    const where = `${host}:${u.port === '' ? '5432' : u.port}`
    return { where, user: decodeURIComponent(u.username), database: decodeURIComponent(u.pathname.slice(1)) }
  } catch {
    return { where: 'its server', user: '', database: '' }
  }
}

function describeDatabaseError (err: unknown, url: string, timedOutAfterMs?: number): StartupError {
  const { where, user, database } = target(url)
  const e = err as Error & { code?: string }
  const byCode: Record<string, string> = {
    ECONNREFUSED: `connection refused by ${where}; is PostgreSQL running there, and are the URL's host and port right?`,
    ENOTFOUND: `the host of ${where} cannot be resolved; check the URL's host name`,
    EAI_AGAIN: `the host of ${where} cannot be resolved right now (DNS); check the URL's host name`,
    EHOSTUNREACH: `${where} is unreachable from here; check the URL's host`,
    ENETUNREACH: `${where} is unreachable from here (no route); check the URL's host`,
    ETIMEDOUT: `no answer from ${where}; check the URL's host, port and any firewall`,
    '28P01': `password authentication failed for user "${user}" on ${where}; check the user and password in the URL`,
    28000: `${where} refused user "${user}": ${e.message}; check the URL's user (and the server's pg_hba.conf)`,
    '3D000': `database "${database}" does not exist on ${where}; create it, or fix the database name in the URL`,
    '57P03': `the server at ${where} is starting up or shutting down; start again once it is up`,
    53300: `the server at ${where} has no free connection slots; start again later, or raise its max_connections`
  }
  const known = timedOutAfterMs !== undefined
    ? `no answer from ${where} within ${timedOutAfterMs / 1000} s; check the URL's host, port and any firewall`
    : byCode[e.code ?? '']
  const line = known ?? (/ssl|certificate/i.test(e.message)
    ? `TLS to ${where} failed: ${e.message}; check sslmode in the URL`
    : `cannot connect to ${where}${database === '' ? '' : `/${database}`}: ${e.message}`)
  return new StartupError(`DATABASE_URL: ${line}`, { cause: err })
}

/** Connects once, to say exactly what is wrong before anything else. */
/** How long a start waits for the database's first answer. */
const DATABASE_CHECK_MS = 10_000

export async function checkDatabase (url: string, timeoutMs = DATABASE_CHECK_MS): Promise<void> {
  // pg gives up after connectionTimeoutMillis (any stage: TCP, TLS, authentication) by closing the socket.
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: timeoutMs })
  // A failure after connect() has settled (the server going away) must not become an unhandled 'error' event.
  client.on('error', () => {})
  const started = Date.now()
  try {
    await client.connect()
  } catch (err) {
    throw describeDatabaseError(err, url, Date.now() - started >= timeoutMs ? timeoutMs : undefined)
  }
  await client.end().catch(() => {})
}

// The migrations are the only step of building the app that can fail on a reachable database.
export function describeBuildError (err: unknown, url: string): StartupError {
  if (err instanceof StartupError) return err
  const e = err as { code?: string, message?: string }
  // A system error, or a SQLSTATE a server answers a connection with (the others come from statements).
  if (/^(E[A-Z]+|28P01|28000|3D000|57P03|53300)$/.test(e.code ?? '')) return describeDatabaseError(err, url)
  // node-pg-migrate sometimes wraps the driver's error into a message that carries its stack.
  const reason = (e.message ?? String(err)).split('\n')[0]?.trim() ?? ''
  const sqlState = /^[0-9A-Z]{5}$/.test(e.code ?? '') ? ` (SQLSTATE ${e.code})` : ''
  if (sqlState !== '' || /migration/i.test(reason)) {
    const hint = e.code === '42501' || /permission denied/.test(reason)
      ? `the URL's user "${target(url).user}" needs the right to create tables in that database`
      : "is this the petstore's database, and this version's migrations?"
    return new StartupError(`DATABASE_URL: applying the migrations failed: ${reason}${sqlState}; ${hint}`,
      { cause: err })
  }
  return new StartupError(`the start failed unexpectedly while building the service: ${reason}`, { cause: err })
}
