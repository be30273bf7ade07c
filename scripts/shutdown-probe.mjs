// Watches one instance through a graceful shutdown, as a load balancer and its clients would.
//   node scripts/shutdown-probe.mjs BASE_URL API_KEY -- COMMAND [ARGS...]   (COMMAND delivers SIGTERM)
// Before COMMAND: a keep-alive client that keeps listing, and an idle keep-alive socket that never speaks again (one
// that could hold the process open until keepAliveTimeout). After it: ready must turn 503 at once, every answer
// carry `Connection: close`, no request fail but a new connection refused once the listener closed (or, through a
// port-forwarding proxy such as docker-proxy, accepted and dropped), and the idle socket be closed by the server.
// Prints one JSON line; exits 0 when the shutdown behaved, 1 otherwise. Bounded: 60 s.
import http from 'node:http'
import net from 'node:net'
import { spawnSync } from 'node:child_process'
import process from 'node:process'
import { setTimeout as sleep } from 'node:timers/promises'

const sep = process.argv.indexOf('--')
const [base, key] = process.argv.slice(2, sep)
const killCmd = process.argv.slice(sep + 1)
if (sep < 0 || !base || !key || killCmd.length === 0) {
  console.error('usage: shutdown-probe.mjs BASE_URL API_KEY -- COMMAND [ARGS...]')
  process.exit(2)
}
const target = new URL(base)
/** How soon after SIGTERM readiness must answer 503. */
const READY_503_WITHIN_MS = 1000
const BOUND_MS = 60_000
const REQUEST_TIMEOUT_MS = 5000
const POLL_MS = 100
/** How long the server may take to close the idle socket after the listener closed. */
const IDLE_CLOSE_MS = 5000
const keepAlive = new http.Agent({ keepAlive: true, maxSockets: 1 })

function request (path, { agent = false, headers = {} } = {}) {
  return new Promise((resolve, reject) => {
    const options = { host: target.hostname, port: target.port, path, agent, headers, timeout: REQUEST_TIMEOUT_MS }
    const req = http.request(options, res => {
      res.resume()
      res.on('end', () => resolve({ status: res.statusCode, connection: res.headers.connection }))
      res.on('error', reject)
    })
    req.on('timeout', () => req.destroy(new Error('timeout')))
    req.on('error', err => {
      err.reusedSocket = req.reusedSocket
      reject(err)
    })
    req.end()
  })
}

const api = () => request('/v1/categories', { agent: keepAlive, headers: { authorization: `Bearer ${key}` } })

// Warm up the keep-alive socket: two requests on it.
const w1 = await api()
const w2 = await api()
if (w1.status !== 200 || w2.status !== 200) {
  console.log(JSON.stringify({ ok: false, reason: `warm-up answered ${w1.status}/${w2.status}` }))
  process.exit(1)
}

// The idle keep-alive socket: one request, read the answer, then stay silent.
const idle = net.connect({ host: target.hostname, port: Number(target.port) })
const idleState = { closedAt: null }
await new Promise((resolve, reject) => {
  idle.once('error', reject)
  idle.once('connect', () => {
    idle.write(`GET /health/live HTTP/1.1\r\nHost: ${target.host}\r\nConnection: keep-alive\r\n\r\n`)
  })
  idle.once('data', () => resolve())
})
idle.on('error', () => {})
idle.on('close', () => {
  idleState.closedAt = Date.now()
})

const signalledAt = Date.now()
const killed = spawnSync(killCmd[0], killCmd.slice(1), { stdio: ['ignore', 'ignore', 'inherit'] })
// The signal lands somewhere between signalledAt and now (podman kill alone can take 0.3 s).
const killReturnedAt = Date.now()
if (killed.status !== 0) {
  console.log(JSON.stringify({ ok: false, reason: `kill command exited ${killed.status}` }))
  process.exit(1)
}

const result = {
  ok: true,
  killCommandMs: killReturnedAt - signalledAt,
  readyTurned503AfterMs: null,
  drainApiOk: 0,
  drainApiWithoutConnectionClose: 0,
  failures: [],
  listenerClosedAfterMs: null,
  listenerClosedSeenAs: null,
  idleKeepAliveClosedAfterMs: null
}
// Refused, or (through docker-proxy) accepted and dropped once the instance shows it is shutting down; a reset on a
// reused keep-alive socket never counts.
const listenerGone = err =>
  err.code === 'ECONNREFUSED' ||
  (err.code === 'ECONNRESET' && !err.reusedSocket && result.readyTurned503AfterMs !== null)
const deadline = signalledAt + BOUND_MS
while (Date.now() < deadline) {
  let closed = false
  try {
    const r = await request('/health/ready')
    if (r.status === 503 && result.readyTurned503AfterMs === null) {
      result.readyTurned503AfterMs = Date.now() - signalledAt
    }
    if (r.status === 200 && result.readyTurned503AfterMs !== null) result.failures.push('ready answered 200 after 503')
  } catch (err) {
    if (listenerGone(err)) closed = err.code
    else result.failures.push(`ready: ${err.code ?? err.message}`)
  }
  if (!closed) {
    try {
      const r = await api()
      if (r.status === 200) result.drainApiOk++
      else result.failures.push(`api answered ${r.status} during drain`)
      // Counted from the moment the instance shows it has seen the signal (ready 503).
      if (r.connection !== 'close' && result.readyTurned503AfterMs !== null) result.drainApiWithoutConnectionClose++
    } catch (err) {
      if (listenerGone(err)) closed = err.code
      else result.failures.push(`api: ${err.code ?? err.message}${err.reusedSocket ? ' on a reused socket' : ''}`)
    }
  }
  if (closed) {
    result.listenerClosedAfterMs = Date.now() - signalledAt
    result.listenerClosedSeenAs = closed
    break
  }
  await sleep(POLL_MS)
}
// Give the idle socket a moment to be closed by the server if it has not been already.
const idleDeadline = Date.now() + IDLE_CLOSE_MS
while (idleState.closedAt === null && Date.now() < idleDeadline) await sleep(POLL_MS)
result.idleKeepAliveClosedAfterMs = idleState.closedAt === null ? null : idleState.closedAt - signalledAt
idle.destroy()
keepAlive.destroy()

const ready503 = result.readyTurned503AfterMs
if (ready503 === null || ready503 - result.killCommandMs > READY_503_WITHIN_MS) {
  result.failures.push(`ready did not turn 503 within ${READY_503_WITHIN_MS} ms of SIGTERM`)
}
if (result.drainApiWithoutConnectionClose > 0) result.failures.push('responses after SIGTERM without Connection: close')
if (result.listenerClosedAfterMs === null) result.failures.push(`listener still open after ${BOUND_MS / 1000} s`)
if (result.idleKeepAliveClosedAfterMs === null) result.failures.push('idle keep-alive socket left open by the server')
result.ok = result.failures.length === 0
console.log(JSON.stringify(result))
process.exit(result.ok ? 0 : 1)
