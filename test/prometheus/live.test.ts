import { execFile, spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import { stringify } from 'yaml'
import { testDatabase } from '../helpers/database.js'
import { freePort } from '../helpers/ports.js'
import { startServer } from '../helpers/server-process.js'
import { TcpProxy } from '../helpers/tcp-proxy.js'
import { alertRules, dashboardQueries, dashboardVariables, quickRules, recordingRules } from './rule-files.js'

/*
 * Debian's Prometheus (2.42) scraping the built service (dist/, as the image runs it) on a real PostgreSQL behind a
 * proxy this test cuts: a short load of every kind of answer, then a database outage. Every rule's expression and
 * every dashboard query must return series, the database alert must fire during the outage and resolve after it.
 * The rules are the real file, evaluated every second with every `for:` shortened (rule-files.ts's quickRules).
 */

const KEY = 'prometheus-test-key-0123456789'
const SCRAPE_INTERVAL = '1s'
const HOLD_FOR = '2s'
/** What Grafana's $__rate_interval is at a 1 s scrape: at least four scrapes. */
const RATE_INTERVAL = '30s'
const LOAD_MS = 12_000
const ALERT_WAIT_MS = 45_000
/** An address in a documentation range, sent as X-Forwarded-For only: its failed keys have a limit of their own. */
const ATTACKER = '192.0.2.10'

const db = await testDatabase(t)
const target = new URL(db.url)
const proxy = await TcpProxy.start({ host: target.hostname, port: Number(target.port) })
t.teardown(async () => { await proxy.close() })

const metricsPort = await freePort()
const service = await startServer(t, {
  DATABASE_URL: proxy.url(db.url),
  API_KEYS: KEY,
  METRICS_PORT: String(metricsPort),
  // Nothing listens there: Redis is down, so rate_limit_redis_* exist and the limits count per instance.
  REDIS_URL: `redis://127.0.0.1:${await freePort()}`,
  TRUST_PROXY: 'true',
  RATE_LIMIT_AUTH_FAILURES: '3',
  RATE_LIMIT_WINDOW_MS: '1000'
})
const api = `http://127.0.0.1:${service.port}`

const work = await mkdtemp(path.join(tmpdir(), 'petstore-prometheus-'))
t.teardown(async () => { await rm(work, { recursive: true, force: true }) })
await writeFile(path.join(work, 'rules.yaml'), quickRules(SCRAPE_INTERVAL, HOLD_FOR))
await writeFile(path.join(work, 'prometheus.yaml'), stringify({
  global: { scrape_interval: SCRAPE_INTERVAL, scrape_timeout: SCRAPE_INTERVAL, evaluation_interval: SCRAPE_INTERVAL },
  rule_files: [path.join(work, 'rules.yaml')],
  scrape_configs: [{ job_name: 'petstore', static_configs: [{ targets: [`127.0.0.1:${metricsPort}`] }] }]
}))
const prometheusPort = await freePort()
const prometheus = spawn('prometheus', [
  `--config.file=${path.join(work, 'prometheus.yaml')}`,
  `--storage.tsdb.path=${path.join(work, 'data')}`,
  `--web.listen-address=127.0.0.1:${prometheusPort}`,
  '--log.level=warn'
], { stdio: ['ignore', 'ignore', 'pipe'] })
let prometheusLog = ''
prometheus.stderr.on('data', (chunk: Buffer) => { prometheusLog += chunk.toString() })
const prometheusExited = once(prometheus, 'close')
t.teardown(async () => {
  prometheus.kill('SIGTERM')
  await prometheusExited
})
const prometheusUrl = `http://127.0.0.1:${prometheusPort}`

async function until (what: string, check: () => Promise<boolean>, timeoutMs = ALERT_WAIT_MS): Promise<number> {
  const started = Date.now()
  while (!(await check().catch(() => false))) {
    if (Date.now() - started > timeoutMs) throw new Error(`timed out waiting until ${what}\n${prometheusLog}`)
    await sleep(250)
  }
  return Date.now() - started
}

interface Sample { metric: Record<string, string>, value: [number, string] }
async function query (expr: string): Promise<Sample[]> {
  const res = await fetch(`${prometheusUrl}/api/v1/query?query=${encodeURIComponent(expr)}`)
  const body = await res.json() as { status: string, error?: string, data?: { resultType: string, result: Sample[] } }
  if (body.status !== 'success' || body.data === undefined) throw new Error(`${expr}: ${body.error ?? res.status}`)
  return body.data.result
}

interface Alert { labels: Record<string, string>, state: string }
async function alerts (): Promise<Alert[]> {
  const body = await (await fetch(`${prometheusUrl}/api/v1/alerts`)).json() as { data: { alerts: Alert[] } }
  return body.data.alerts
}
const databaseAlert = async (): Promise<Alert | undefined> =>
  (await alerts()).find(alert => alert.labels.alertname === 'PetstoreDatabaseUnavailable')

/** Requests of every kind the rules and panels count, `clients` at a time, until `stop` says so. */
async function load (stop: () => boolean): Promise<Map<number, number>> {
  const statuses = new Map<number, number>()
  const auth = { authorization: `Bearer ${KEY}` }
  // Each client updates and then deletes the category it created last.
  const requests: Array<(created: string) => Promise<Response>> = [
    async () => await fetch(`${api}/v1/categories`, {
      method: 'POST',
      headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify({ name: `load ${Math.random()}` })
    }),
    async () => await fetch(`${api}/v1/categories`, { headers: { ...auth, 'accept-encoding': 'gzip' } }),
    async (created) => await fetch(`${api}/v1/categories/${created}`, { headers: auth }),
    async (created) => await fetch(`${api}/v1/categories/${created}`, {
      method: 'PATCH',
      headers: { ...auth, 'content-type': 'application/merge-patch+json' },
      body: JSON.stringify({ description: 'updated under load' })
    }),
    async () => await fetch(`${api}/v1/pets/1`, { headers: auth }),
    async () => await fetch(`${api}/v1/categories`, {
      headers: { authorization: 'Bearer wrong', 'x-forwarded-for': ATTACKER }
    }),
    async (created) => await fetch(`${api}/v1/categories/${created}`, { method: 'DELETE', headers: auth })
  ]
  const client = async (): Promise<void> => {
    let created = '1'
    for (let i = 0; !stop(); i++) {
      const request = requests[i % requests.length] as (created: string) => Promise<Response>
      const res = await request(created).catch(() => undefined)
      const body = await res?.text()
      const status = res?.status ?? 0
      if (status === 201) created = String((JSON.parse(body ?? '{}') as { id: unknown }).id)
      statuses.set(status, (statuses.get(status) ?? 0) + 1)
      await sleep(20)
    }
  }
  await Promise.all([client(), client(), client()])
  return statuses
}

/** `$job`, `${resource}` and Grafana's own variables, each variable as Grafana would resolve it from Prometheus. */
async function resolveVariables (): Promise<Array<Record<string, string>>> {
  const resolved: Record<string, string[]> = { __rate_interval: [RATE_INTERVAL] }
  // A variable's query may name the variables before it: their first value stands in.
  const first: Record<string, string> = { __rate_interval: RATE_INTERVAL }
  for (const variable of dashboardVariables().filter(v => v.type === 'query')) {
    const text = typeof variable.query === 'string' ? variable.query : variable.query?.query ?? ''
    const parts = /^label_values\((.+), *(\w+)\)$/.exec(text)
    if (parts === null) throw new Error(`variable ${variable.name}: not a label_values query: ${text}`)
    const [, selector = '', label = ''] = parts
    const url = `${prometheusUrl}/api/v1/label/${label}/values?match[]=${encodeURIComponent(fill(selector, first))}`
    const body = await (await fetch(url)).json() as { data: string[] }
    // Grafana writes the regex between slashes.
    const regex = (variable.regex ?? '') === '' ? undefined : new RegExp((variable.regex ?? '').slice(1, -1))
    const values = body.data.map(value => regex === undefined ? value : regex.exec(value)?.[1] ?? '')
    resolved[variable.name] = values.filter(value => value !== '')
    first[variable.name] = resolved[variable.name]?.[0] ?? ''
  }
  // One set of values for each value of each variable (there is one job; a resource at a time).
  let sets: Array<Record<string, string>> = [{}]
  for (const [name, values] of Object.entries(resolved)) {
    sets = sets.flatMap(set => values.map(value => ({ ...set, [name]: value })))
  }
  return sets
}

function fill (expr: string, values: Record<string, string>): string {
  const variable = /\$\{(\w+)\}|\$(\w+)/g
  return expr.replace(variable, (whole, braced?: string, bare?: string) => values[braced ?? bare ?? ''] ?? whole)
}

/** An alert's expression with every comparison made `bool`: series wherever its inputs exist, firing or not. */
const unfiltered = (expr: string): string => expr.replace(/ (==|!=|>=|<=|>|<) /g, ' $1 bool ')

await until('Prometheus is ready', async () => (await fetch(`${prometheusUrl}/-/ready`)).ok, 30_000)
await until('the service is scraped', async () => (await query('up{job="petstore"} == 1')).length === 1, 30_000)

t.test('under load: the service\'s own metric names pass promtool check metrics', async t => {
  const started = Date.now()
  const statuses = await load(() => Date.now() - started > LOAD_MS)
  t.comment(`answers by status: ${JSON.stringify(Object.fromEntries(statuses))}`)
  for (const status of [200, 201, 204, 401, 429, 501]) t.ok((statuses.get(status) ?? 0) > 0, `the load met ${status}`)
  const scrape = await (await fetch(`http://127.0.0.1:${metricsPort}/metrics`)).text()
  const checked = await new Promise<{ code: number | null, output: string }>(resolve => {
    const child = execFile('promtool', ['check', 'metrics'], (err, stdout, stderr) => {
      resolve({ code: err === null ? 0 : (child.exitCode ?? 1), output: stdout + stderr })
    })
    child.stdin?.end(scrape)
  })
  const complaints = checked.output.split('\n').filter(line => line.trim() !== '')
  t.comment(`promtool check metrics: ${complaints.length} lines, ${scrape.split('\n').length} lines scraped`)
  // prom-client's default nodejs_active_*_total gauges are the library's names (issue 41 leaves them).
  t.same(complaints.filter(line => !line.startsWith('nodejs_')), [], 'nothing about the service\'s own metrics')
  t.ok(scrape.includes('\nhealth_ready 1\n'), 'ready under load')
  const removed = /^categories_list_rows_changed_total\{change="removed"\} [1-9]/m
  t.match(scrape, removed, 'the cached list followed the deletes')
})

t.test('a database outage: PetstoreDatabaseUnavailable fires during it and resolves after it', async t => {
  let outage = true
  proxy.down()
  const during = load(() => !outage)
  const fired = await until('the database alert fires', async () => (await databaseAlert())?.state === 'firing')
  t.pass(`firing ${fired} ms after the database went away`)
  t.match(await databaseAlert(), { labels: { severity: 'critical', reason: 'database_unavailable', job: 'petstore' } })
  proxy.restore()
  const resolved = await until('the database alert resolves', async () => (await databaseAlert()) === undefined)
  t.pass(`resolved ${resolved} ms after the database came back`)
  outage = false
  const statuses = await during
  t.ok((statuses.get(503) ?? 0) > 0, `the outage answered 503s: ${JSON.stringify(Object.fromEntries(statuses))}`)
})

t.test('every rule evaluates without error and every expression returns series', async t => {
  const body = await (await fetch(`${prometheusUrl}/api/v1/rules`)).json() as
    { data: { groups: Array<{ rules: Array<{ name: string, health: string, lastError?: string }> }> } }
  const loaded = body.data.groups.flatMap(group => group.rules)
  t.equal(loaded.length, alertRules().length + recordingRules().length, 'Prometheus loaded every rule')
  for (const rule of loaded) t.equal(rule.health, 'ok', `${rule.name}: ${rule.lastError ?? 'ok'}`)
  for (const { record } of recordingRules()) {
    t.ok((await query(record)).length > 0, `recorded: ${record}`)
  }
  for (const { alert, expr } of alertRules()) {
    t.ok((await query(unfiltered(expr))).length > 0, `${alert}: ${unfiltered(expr).replace(/\s+/g, ' ')}`)
  }
})

t.test('every dashboard query returns series, for every value of its variables', async t => {
  const sets = await resolveVariables()
  t.ok(sets.length > 0 && sets.every(set => set.job === 'petstore' && set.resource !== undefined), JSON.stringify(sets))
  for (const values of sets) {
    for (const { panel, expr } of dashboardQueries()) {
      const filled = fill(expr, values)
      t.notMatch(filled, /\$/, `${panel}: every variable is known`)
      t.ok((await query(filled)).length > 0, `${panel} (${values.resource}): ${filled}`)
    }
  }
})
