// Driver for `npm run test:cluster` (started by scripts/test-cluster.sh, which provides
// HAProxy, a fresh database and the built app).
//
// It starts N instances of dist/server.js on loopback, waits until HAProxy sees them all UP,
// then runs keep-alive writers (one POST per unique name, never retried once a response or a
// network error came back) and list readers through HAProxy while it restarts every instance
// in turn (SIGTERM, wait for exit, start again, wait until ready and UP in HAProxy).
// It passes only if no request failed, every id answered 201 is in the final list with its
// name, no row exists that no client sent, and all ids are unique. Exit 0 on pass, 1 on fail.
//
// With REDIS_PORT it also starts a redis-server there (REDIS_URL of every instance), checks
// that the instances share one failed-authentication limit (a burst of 20 failures spread over
// them by HAProxy, then the 21st refused by each), and, under the same load after the rolling
// restart, stops Redis for a few seconds and starts it again: no request may fail meanwhile.
//
// Environment: LB_URL, STATS_URL, DATABASE_URL, API_KEY, INSTANCE_PORTS (comma list),
// METRICS_PORTS (comma list, or empty for none), WORK_DIR (logs and pid file),
// WRITERS (20), READERS (4), MIN_CREATES (2000), CREATE_RATE (per second, all writers: 300),
// SHUTDOWN_DRAIN_MS (2000), REDIS_PORT (unset: no Redis), REDIS_OUTAGE_MS (3000).
import http from 'node:http'
import fs from 'node:fs'
import net from 'node:net'
import path from 'node:path'
import process from 'node:process'
import { spawn } from 'node:child_process'
import { setTimeout as sleep } from 'node:timers/promises'
import pg from 'pg'

const env = process.env
const lb = new URL(env.LB_URL ?? 'http://127.0.0.1:3100')
const statsUrl = env.STATS_URL ?? 'http://127.0.0.1:3199/stats;csv'
const apiKey = env.API_KEY
const databaseUrl = env.DATABASE_URL
const ports = (env.INSTANCE_PORTS ?? '3101,3102,3103').split(',').map(Number)
const metricsPorts = (env.METRICS_PORTS ?? '').split(',').filter(Boolean).map(Number)
const workDir = env.WORK_DIR ?? '.'
const writers = Number(env.WRITERS ?? 20)
const readers = Number(env.READERS ?? 4)
const minCreates = Number(env.MIN_CREATES ?? 2000)
const createRate = Number(env.CREATE_RATE ?? 300)
const drainMs = env.SHUTDOWN_DRAIN_MS ?? '2000'
const redisPort = Number(env.REDIS_PORT ?? 0)
const redisOutageMs = Number(env.REDIS_OUTAGE_MS ?? 3000)
const runId = `cl${Date.now().toString(36)}`
if (!apiKey || !databaseUrl) {
  console.error('cluster-load: API_KEY and DATABASE_URL are required')
  process.exit(2)
}

const log = (...a) => console.log(`[${((performance.now()) / 1000).toFixed(1).padStart(6)}s]`, ...a)

// ---------- instances ----------
const instances = ports.map((port, i) => ({ index: i + 1, port, metricsPort: metricsPorts[i] ?? 0, child: null, starts: 0 }))
const pidFile = path.join(workDir, 'instance.pids')

function writePids () {
  const children = [...instances.map((x) => x.child), redis.child].filter(Boolean)
  fs.writeFileSync(pidFile, children.map((child) => child.pid).join('\n') + '\n')
}

// The flags npm start runs the service with (package.json: "node <flags> dist/server.js").
const startFlags = JSON.parse(fs.readFileSync('package.json', 'utf8')).scripts.start.trim().split(/\s+/).slice(1, -1)

function startInstance (inst) {
  inst.starts++
  const out = fs.openSync(path.join(workDir, `instance-${inst.index}.log`), 'a')
  inst.child = spawn(process.execPath, [...startFlags, 'dist/server.js'], {
    stdio: ['ignore', out, out],
    env: {
      ...env,
      NODE_ENV: 'production',
      HOST: '127.0.0.1',
      PORT: String(inst.port),
      METRICS_HOST: '127.0.0.1',
      METRICS_PORT: String(inst.metricsPort),
      DATABASE_URL: databaseUrl,
      API_KEYS: apiKey,
      SHUTDOWN_DRAIN_MS: drainMs,
      LOG_LEVEL: env.INSTANCE_LOG_LEVEL ?? 'warn',
      TRUST_PROXY: 'true',
      ...(redisPort ? { REDIS_URL: `redis://127.0.0.1:${redisPort}` } : {})
    }
  })
  fs.closeSync(out)
  inst.exited = new Promise((resolve) => inst.child.once('exit', (code, signal) => resolve({ code, signal })))
  writePids()
}

// ---------- Redis (shared rate limits) ----------
const redis = { child: null, exited: null, starts: 0 }

function startRedis () {
  redis.starts++
  const out = fs.openSync(path.join(workDir, 'redis.log'), 'a')
  redis.child = spawn('redis-server', ['--port', String(redisPort), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', workDir], { stdio: ['ignore', out, out] })
  fs.closeSync(out)
  redis.exited = new Promise((resolve) => redis.child.once('exit', resolve))
  writePids()
}

async function stopRedis () {
  redis.child.kill('SIGTERM')
  await redis.exited
  redis.child = null
  writePids()
}

/** PING over a raw connection: +PONG once Redis accepts commands. */
function redisAnswers () {
  return new Promise((resolve) => {
    const socket = net.connect(redisPort, '127.0.0.1', () => socket.write('PING\r\n'))
    socket.setTimeout(1000, () => socket.destroy())
    socket.on('data', (d) => { resolve(d.toString().startsWith('+PONG')); socket.destroy() })
    socket.on('error', () => resolve(false))
    socket.on('close', () => resolve(false))
  })
}

/** One HTTP exchange: the whole body as text, or an error (a timeout destroys the request). */
function exchange (req, payload) {
  return new Promise((resolve, reject) => {
    req.on('response', (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }))
      res.on('error', reject)
    })
    req.on('timeout', () => req.destroy(new Error('timeout')))
    req.on('error', reject)
    req.end(payload)
  })
}

function get (url, { agent = false, headers = {}, timeout = 5000 } = {}) {
  return exchange(http.request(url, { agent, headers, timeout }))
}

async function waitFor (what, check, timeoutMs) {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    try { if (await check()) return } catch {}
    await sleep(100)
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
}

async function haproxyStatus () {
  const res = await get(statsUrl)
  const [header, ...lines] = res.body.trim().split('\n')
  const cols = header.replace(/^# /, '').split(',')
  const rows = lines.map((l) => Object.fromEntries(l.split(',').map((v, i) => [cols[i], v])))
  return rows
}

async function serverState (inst) {
  const rows = await haproxyStatus()
  return rows.find((r) => r.pxname === 'api' && r.svname === `s${inst.index}`)?.status
}

const waitReady = (inst) => waitFor(`instance ${inst.index} ready`, async () => (await get(`http://127.0.0.1:${inst.port}/health/ready`, { timeout: 1000 })).status === 200, 60_000)
const waitUp = (inst) => waitFor(`HAProxy to mark s${inst.index} UP`, async () => (await serverState(inst)) === 'UP', 20_000)

// ---------- load ----------
const stats = {
  postsSent: 0,
  created: new Map(), // id -> name
  acked: [], // [ackedAt, id] in the order the 201s arrived
  staleLists: 0, // lists missing an id whose 201 arrived >= consistencyMs before the GET was sent
  maxMissingInAList: 0,
  duplicateIdsInResponses: 0,
  listsOk: 0,
  failures: [], // { kind, detail }
  postLatencies: [],
  listLatencies: []
}
const sentNames = new Set()
const failedNames = new Set()
// Flags the load loops watch; set by the main flow.
const run = { stop: false, aborted: false }

function failure (kind, detail) {
  stats.failures.push({ kind, detail, at: Math.round(performance.now()) })
  if (stats.failures.length <= 20) log(`FAILURE ${kind}: ${detail}`)
}

function post (agent, body) {
  const payload = JSON.stringify(body)
  return exchange(http.request({
    host: lb.hostname,
    port: lb.port,
    path: '/v1/categories',
    method: 'POST',
    agent,
    timeout: 15_000,
    headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) }
  }), payload)
}

async function writer (w) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
  const paceMs = (writers * 1000) / createRate
  let seq = 0
  while (!run.aborted && !(run.stop && stats.created.size + stats.failures.length >= minCreates)) {
    const name = `${runId}-w${w}-${seq++}`
    sentNames.add(name)
    stats.postsSent++
    const t0 = performance.now()
    try {
      const res = await post(agent, { name, description: `writer ${w}` })
      stats.postLatencies.push(performance.now() - t0)
      if (res.status !== 201) {
        failedNames.add(name)
        failure(`POST ${res.status}`, res.body.slice(0, 200))
      } else {
        const body = JSON.parse(res.body)
        if (stats.created.has(body.id)) stats.duplicateIdsInResponses++
        stats.created.set(body.id, body.name)
        stats.acked.push([performance.now(), body.id])
        if (body.name !== name) failure('POST wrong body', `sent ${name}, got ${res.body.slice(0, 200)}`)
        if (res.headers.location !== `/v1/categories/${body.id}`) failure('POST Location', String(res.headers.location))
      }
    } catch (err) {
      // Never retried: the row may or may not exist, which the final check accounts for.
      failedNames.add(name)
      failure(`POST ${err.code ?? err.message}`, name)
    }
    const wait = paceMs - (performance.now() - t0)
    if (wait > 0) await sleep(wait)
  }
  agent.destroy()
}

// The contract: once a create answered 201, a GET on any instance includes it within 100 ms.
// Each list is checked against every 201 that arrived at least consistencyMs before it was sent.
const consistencyMs = Number(env.CONSISTENCY_MS ?? 100)
async function reader (r) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
  while (!run.stop) {
    const t0 = performance.now()
    const ackedBefore = stats.acked.length
    try {
      const res = await get(new URL('/v1/categories', lb), { agent, headers: { authorization: `Bearer ${apiKey}` }, timeout: 15_000 })
      stats.listLatencies.push(performance.now() - t0)
      const list = res.status === 200 ? JSON.parse(res.body) : null
      if (res.status !== 200) failure(`GET ${res.status}`, res.body.slice(0, 200))
      else if (!Array.isArray(list)) failure('GET body', 'not an array')
      else {
        stats.listsOk++
        const ids = new Set(list.map((c) => c.id))
        let missing = 0
        for (let i = 0; i < ackedBefore; i++) {
          const [ackedAt, id] = stats.acked[i]
          if (ackedAt > t0 - consistencyMs) break
          if (!ids.has(id)) missing++
        }
        if (missing > 0) {
          stats.staleLists++
          stats.maxMissingInAList = Math.max(stats.maxMissingInAList, missing)
        }
      }
    } catch (err) {
      failure(`GET ${err.code ?? err.message}`, `reader ${r}`)
    }
    await sleep(50)
  }
  agent.destroy()
}

// ---------- shared limits ----------
const limitChecks = []

/** The value of a metric without labels on an instance's metrics listener. */
async function instanceMetric (inst, name) {
  const res = await get(`http://127.0.0.1:${inst.metricsPort}/metrics`, { timeout: 2000 })
  const line = res.body.split('\n').find((l) => l.startsWith(`${name} `))
  return line === undefined ? undefined : Number(line.split(' ')[1])
}

/**
 * 20 failed authentications from one client address (X-Forwarded-For, which the instances
 * trust) through HAProxy, which spreads them over every instance; then the 21st attempt, and
 * even a valid key, must be 429 at each instance. Per-instance counters would allow 60.
 */
async function sharedLimitBurst (address) {
  const before = await haproxyStatus()
  const bad = { authorization: 'Bearer not-a-key', 'x-forwarded-for': address }
  const statuses = []
  for (let i = 0; i < 20; i++) statuses.push((await get(new URL('/v1/categories', lb), { headers: bad })).status)
  const after = await haproxyStatus()
  const spread = instances.map((inst) => {
    const count = (rows) => Number(rows.find((r) => r.pxname === 'api' && r.svname === `s${inst.index}`)?.stot ?? 0)
    return count(after) - count(before)
  })
  const refused = []
  for (const inst of instances) {
    const direct = new URL('/v1/categories', `http://127.0.0.1:${inst.port}`)
    refused.push((await get(direct, { headers: bad })).status)
    refused.push((await get(direct, { headers: { authorization: `Bearer ${apiKey}`, 'x-forwarded-for': address } })).status)
  }
  const check = { address, first20: statuses.filter((s) => s === 401).length, spreadOverInstances: spread, thenAtEachInstance: refused }
  limitChecks.push(check)
  log(`shared limit from ${address}: ${check.first20} of 20 were 401 (spread ${spread.join('/')}), then ${refused.join(',')} at the instances`)
  if (check.first20 !== 20) failure('shared limit', `only ${check.first20} of the first 20 failed attempts from ${address} were 401`)
  if (!refused.every((s) => s === 429)) failure('shared limit', `after 20 failures from ${address} the instances answered ${refused.join(',')}, not 429`)
  if (spread.some((n) => n === 0)) failure('shared limit', `HAProxy did not spread the burst over every instance: ${spread.join('/')}`)
}

/** Stops Redis under load, waits, starts it again; the load must see no failure, every instance must come back to Redis. */
const outage = {}
async function redisOutage () {
  log(`Redis: SIGTERM, ${redisOutageMs} ms without it`)
  const failuresBefore = stats.failures.length
  await stopRedis()
  await sleep(redisOutageMs)
  outage.metricWhileDown = await Promise.all(instances.map((inst) => instanceMetric(inst, 'rate_limit_redis_up')))
  startRedis()
  const t0 = performance.now()
  await waitFor('redis-server to answer again', redisAnswers, 10_000)
  await waitFor('every instance back on Redis', async () =>
    (await Promise.all(instances.map((inst) => instanceMetric(inst, 'rate_limit_redis_up')))).every((v) => v === 1), 15_000)
  outage.backOnRedisAfterMs = Math.round(performance.now() - t0)
  outage.fallbacks = await Promise.all(instances.map((inst) => instanceMetric(inst, 'rate_limit_redis_fallbacks_total')))
  outage.failuresDuringOutage = stats.failures.length - failuresBefore
  log(`Redis back; every instance counting in it again after ${outage.backOnRedisAfterMs} ms (fallbacks ${outage.fallbacks.join('/')})`)
  if (!outage.metricWhileDown.every((v) => v === 0)) failure('redis outage', `rate_limit_redis_up while Redis was down: ${outage.metricWhileDown.join(',')}`)
}

// ---------- rolling restart ----------
const restarts = []
async function rollingRestart () {
  for (const inst of instances) {
    const t0 = performance.now()
    log(`rolling restart: SIGTERM instance ${inst.index} (:${inst.port})`)
    inst.child.kill('SIGTERM')
    const timeout = sleep(30_000).then(() => ({ code: 'timeout' }))
    const exit = await Promise.race([inst.exited, timeout])
    const exitedAfterMs = Math.round(performance.now() - t0)
    log(`instance ${inst.index} exited with ${exit.code ?? exit.signal} after ${exitedAfterMs} ms`)
    if (exit.code !== 0) {
      failure('instance exit', `instance ${inst.index} exit ${exit.code ?? exit.signal} after SIGTERM`)
      if (exit.code === 'timeout') inst.child.kill('SIGKILL')
    }
    startInstance(inst)
    await waitReady(inst)
    const readyAfterMs = Math.round(performance.now() - t0)
    await waitUp(inst)
    const upAfterMs = Math.round(performance.now() - t0)
    log(`instance ${inst.index} ready after ${readyAfterMs} ms, UP in HAProxy after ${upAfterMs} ms`)
    restarts.push({ instance: inst.index, exitCode: exit.code ?? exit.signal, exitedAfterMs, readyAfterMs, upAfterMs })
  }
}

function percentile (values, p) {
  if (values.length === 0) return 0
  const s = [...values].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]
}

async function shutdownAll () {
  await Promise.all(instances.map(async (inst) => {
    if (!inst.child || inst.child.exitCode !== null || inst.child.signalCode !== null) return
    inst.child.kill('SIGTERM')
    const done = await Promise.race([inst.exited, sleep(20_000).then(() => null)])
    if (done === null) inst.child.kill('SIGKILL')
  }))
}

async function shutdownAllAndRedis () {
  await shutdownAll()
  if (redis.child) await stopRedis()
}

process.on('SIGTERM', () => { shutdownAllAndRedis().finally(() => process.exit(1)) })
process.on('SIGINT', () => { shutdownAllAndRedis().finally(() => process.exit(1)) })

// ---------- main ----------
let pass = false
const t0 = performance.now()
try {
  if (redisPort) {
    startRedis()
    await waitFor('redis-server to answer', redisAnswers, 10_000)
    log(`redis-server on 127.0.0.1:${redisPort}`)
  }
  for (const inst of instances) startInstance(inst)
  await Promise.all(instances.map(waitReady))
  await Promise.all(instances.map(waitUp))
  log(`${instances.length} instances ready and UP behind HAProxy at ${lb.origin}`)
  if (redisPort) await sharedLimitBurst('192.0.2.21')

  const loadStart = performance.now()
  const load = [
    ...Array.from({ length: writers }, (_, w) => writer(w)),
    ...Array.from({ length: readers }, (_, r) => reader(r))
  ]
  await sleep(1000) // traffic flowing before the first restart
  await rollingRestart()
  if (redisPort) await redisOutage()
  await sleep(1000) // and after the last one
  run.stop = true
  await Promise.all(load)
  const loadSeconds = (performance.now() - loadStart) / 1000
  log('load stopped; checking the final state')
  if (redisPort) await sharedLimitBurst('192.0.2.22') // after the restarts of every instance and of Redis

  // Final list through the balancer, and the table itself.
  const final = await get(new URL('/v1/categories', lb), { headers: { authorization: `Bearer ${apiKey}` }, timeout: 30_000 })
  if (final.status !== 200) throw new Error(`final list answered ${final.status}`)
  const list = JSON.parse(final.body)
  const listById = new Map(list.map((c) => [c.id, c.name]))
  const db = new pg.Client({ connectionString: databaseUrl })
  await db.connect()
  const { rows: [dbCounts] } = await db.query('select count(*)::int as rows, count(distinct id)::int as ids from categories')
  await db.end()

  const missing = [...stats.created].filter(([id, name]) => listById.get(id) !== name)
  const phantom = list.filter((c) => !sentNames.has(c.name))
  const unacknowledged = list.filter((c) => failedNames.has(c.name))
  const uniqueIdsInList = listById.size === list.length
  const figures = {
    instances: instances.length,
    writers,
    readers,
    postsSent: stats.postsSent,
    created201: stats.created.size,
    listsOk: stats.listsOk,
    listsMissingACreateOlderThan100ms: stats.staleLists,
    maxMissingInAList: stats.maxMissingInAList,
    failedRequests: stats.failures.length,
    failuresByKind: stats.failures.reduce((acc, f) => ({ ...acc, [f.kind]: (acc[f.kind] ?? 0) + 1 }), {}),
    finalListRows: list.length,
    tableRows: dbCounts.rows,
    createdMissingFromFinalList: missing.length,
    rowsNoClientSent: phantom.length,
    rowsFromFailedRequests: unacknowledged.length,
    idsUnique: uniqueIdsInList && dbCounts.rows === dbCounts.ids && stats.duplicateIdsInResponses === 0,
    loadSeconds: Number(loadSeconds.toFixed(1)),
    createsPerSecond: Math.round(stats.created.size / loadSeconds),
    postLatencyMs: { p50: Math.round(percentile(stats.postLatencies, 50)), p99: Math.round(percentile(stats.postLatencies, 99)), max: Math.round(percentile(stats.postLatencies, 100)) },
    listLatencyMs: { p50: Math.round(percentile(stats.listLatencies, 50)), p99: Math.round(percentile(stats.listLatencies, 99)), max: Math.round(percentile(stats.listLatencies, 100)) },
    restarts,
    ...(redisPort ? { sharedLimit: limitChecks, redisOutage: outage } : {})
  }
  try {
    const rows = await haproxyStatus()
    figures.haproxy = rows.filter((r) => r.pxname === 'api').map((r) => ({
      server: r.svname, status: r.status, requests: Number(r.stot), retries: Number(r.wretr || 0), redispatches: Number(r.wredis || 0), '5xx': Number(r.hrsp_5xx || 0), connErrors: Number(r.econ || 0), respErrors: Number(r.eresp || 0)
    }))
  } catch {}

  pass = figures.failedRequests === 0 &&
    figures.created201 >= minCreates &&
    figures.createdMissingFromFinalList === 0 &&
    figures.rowsNoClientSent === 0 &&
    figures.idsUnique &&
    figures.finalListRows === figures.tableRows &&
    figures.listsMissingACreateOlderThan100ms === 0 &&
    restarts.length === instances.length && restarts.every((r) => r.exitCode === 0)

  console.log('\n== cluster figures')
  console.log(JSON.stringify(figures, null, 2))
  console.log(`\n  created (201):                 ${figures.created201} (minimum ${minCreates})`)
  console.log(`  failed requests (5xx/reset/refused/other): ${figures.failedRequests}`)
  console.log(`  201 ids missing from final list: ${figures.createdMissingFromFinalList}`)
  console.log(`  rows no client created:        ${figures.rowsNoClientSent}`)
  console.log(`  ids unique:                    ${figures.idsUnique}`)
  console.log(`  lists missing a create acknowledged >= ${consistencyMs} ms before: ${figures.listsMissingACreateOlderThan100ms} of ${figures.listsOk}`)
  console.log(`  final list rows / table rows:  ${figures.finalListRows} / ${figures.tableRows}`)
  console.log(`  instance exits after SIGTERM:  ${restarts.map((r) => `#${r.instance} code ${r.exitCode} in ${r.exitedAfterMs} ms`).join(', ')}`)
  if (redisPort) {
    console.log(`  shared failed-auth limit:      ${limitChecks.map((c) => `${c.first20}x401 over ${c.spreadOverInstances.join('/')}, then ${c.thenAtEachInstance.join(',')}`).join('; ')}`)
    console.log(`  Redis stopped ${redisOutageMs} ms under load: ${outage.failuresDuringOutage} failed requests meanwhile; every instance back on Redis ${outage.backOnRedisAfterMs} ms after its restart`)
  }
} catch (err) {
  console.error(`cluster-load: ${err.stack ?? err}`)
  run.stop = true
  run.aborted = true
} finally {
  await shutdownAllAndRedis()
  try { fs.unlinkSync(pidFile) } catch {}
}
console.log(`\n== test:cluster ${pass ? 'PASSED' : 'FAILED'} (driver ${((performance.now() - t0) / 1000).toFixed(1)} s)`)
process.exit(pass ? 0 : 1)
