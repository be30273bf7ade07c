/*
 * Compression of the cached list, measured two ways in one run:
 *
 * 1. The big list (COMPRESSION_ROWS, 1,000,000 rows of about 113 bytes of JSON)
 *    through a bandwidth-limited link: a network namespace of the bench's own
 *    joined to this one by a veth pair whose service side is shaped with
 *    `tc … tbf` (COMPRESSION_LINK, 100mbit). curl in the namespace GETs the list
 *    as it is, in gzip and in Brotli: the first GET of each coding (the list
 *    compressed then), the next one (compressed already), and the first after a
 *    create (a new version compressed). Bytes on the wire and time to the last
 *    byte. Needs root (ip netns, tc); skipped with a message otherwise.
 * 2. The CPU the service spends per request on the 100-row list, as it is and
 *    compressed (wrk with and without Accept-Encoding): server CPU seconds over
 *    requests answered, interleaved over COMPRESSION_ROUNDS rounds.
 *
 * Decoding is checked too: each compressed body, decoded here, has the SHA-1 of
 * the identity body (its ETag).
 */
import { execFile, execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { readFile } from 'node:fs/promises'
import http from 'node:http'
import net from 'node:net'
import { promisify } from 'node:util'
import { brotliDecompress, gunzip } from 'node:zlib'
import { cpuSeconds } from './proc-stats.js'
import { AUTH, median, numberFromEnv, runToExit, seedBySql, seedLongRows, startLoadGenerator, startPostgres, startServer, type Postgres, type RunningServer } from './servers.js'

const BIG_ROWS = numberFromEnv('COMPRESSION_ROWS', 1_000_000)
const ROUNDS = numberFromEnv('COMPRESSION_ROUNDS', 3)
const DURATION_S = numberFromEnv('COMPRESSION_DURATION', 8)
const LINK = process.env.COMPRESSION_LINK ?? '100mbit'
const runId = Date.now().toString(36)
const log = (message: string): void => { process.stderr.write(`[compression ${new Date().toISOString().slice(11, 19)}] ${message}\n`) }

const CODINGS = ['identity', 'gzip', 'br'] as const
type Coding = typeof CODINGS[number]
const acceptFor = (coding: Coding): Record<string, string> => coding === 'identity' ? {} : { 'accept-encoding': coding }

const mb = (bytes: number): string => `${(bytes / 1e6).toFixed(1)} MB`

/** A namespace joined to this one by a shaped veth pair: the service side sends at `rate`. */
interface Link { namespace: string, hostAddress: string, remove: () => void }

function run (command: string, args: string[]): string {
  return execFileSync(command, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
}

function makeLink (rate: string): Link | string {
  if (process.getuid?.() !== 0) return 'not root: ip netns and tc need root'
  const suffix = (process.pid % 10000).toString()
  const namespace = `petstore-cz-${suffix}`
  const hostSide = `pczh${suffix}`
  const nsSide = `pczn${suffix}`
  const remove = (): void => {
    try { run('ip', ['link', 'del', hostSide]) } catch {}
    try { run('ip', ['netns', 'del', namespace]) } catch {}
  }
  try {
    run('ip', ['netns', 'add', namespace])
    run('ip', ['link', 'add', hostSide, 'type', 'veth', 'peer', 'name', nsSide])
    run('ip', ['link', 'set', nsSide, 'netns', namespace])
    run('ip', ['addr', 'add', '10.247.20.1/30', 'dev', hostSide])
    run('ip', ['link', 'set', hostSide, 'up'])
    run('ip', ['netns', 'exec', namespace, 'ip', 'addr', 'add', '10.247.20.2/30', 'dev', nsSide])
    run('ip', ['netns', 'exec', namespace, 'ip', 'link', 'set', nsSide, 'up'])
    run('ip', ['netns', 'exec', namespace, 'ip', 'link', 'set', 'lo', 'up'])
    // The responses flow from the service side into the namespace: that direction is the slow one.
    run('tc', ['qdisc', 'add', 'dev', hostSide, 'root', 'tbf', 'rate', rate, 'burst', '32kbit', 'latency', '400ms'])
  } catch (err) {
    remove()
    return `could not make the link: ${(err as Error).message.split('\n')[0] ?? ''}`
  }
  return { namespace, hostAddress: '10.247.20.1', remove }
}

/** A TCP relay on the link's address to the service on loopback (the service listens on 127.0.0.1 only). */
async function relay (address: string, target: URL): Promise<{ port: number, close: () => Promise<void> }> {
  const sockets = new Set<net.Socket>()
  const server = net.createServer(client => {
    const upstream = net.connect(Number(target.port), target.hostname)
    for (const socket of [client, upstream]) {
      sockets.add(socket)
      socket.on('error', () => { client.destroy(); upstream.destroy() })
      socket.on('close', () => { sockets.delete(socket) })
    }
    client.pipe(upstream)
    upstream.pipe(client)
  })
  await new Promise<void>(resolve => server.listen(0, address, resolve))
  const port = (server.address() as net.AddressInfo).port
  return {
    port,
    close: async () => {
      for (const socket of sockets) socket.destroy()
      await new Promise(resolve => server.close(resolve))
    }
  }
}

interface Transfer { status: number, bytes: number, firstByteMs: number, totalMs: number }

/** One GET by curl inside the namespace (run asynchronously: the relay is in this process); the body is counted as it came (never decoded). */
async function curlInNamespace (link: Link, port: number, coding: Coding): Promise<Transfer> {
  const headers = Object.entries({ ...AUTH, ...acceptFor(coding) }).flatMap(([name, value]) => ['-H', `${name}: ${value}`])
  const { stdout: out } = await promisify(execFile)('ip', ['netns', 'exec', link.namespace, 'curl', '-s', '-o', '/dev/null', '--max-time', '120',
    '-w', '%{http_code} %{size_download} %{time_starttransfer} %{time_total}', ...headers, `http://${link.hostAddress}:${port}/v1/categories`], { encoding: 'utf8' })
  const [status, bytes, firstByte, total] = out.trim().split(' ').map(Number)
  if (status !== 200) throw new Error(`GET through the link answered ${String(status)}`)
  return { status, bytes: bytes as number, firstByteMs: (firstByte as number) * 1000, totalMs: (total as number) * 1000 }
}

/** A GET on loopback with node:http, which (unlike fetch) hands the body over as it came. */
async function getOnLoopback (server: RunningServer, coding: Coding): Promise<{ raw: Buffer, etag: string, encoding: string | undefined }> {
  return await new Promise((resolve, reject) => {
    http.get(`${server.url}/v1/categories`, { headers: { ...AUTH, ...acceptFor(coding) } }, res => {
      const chunks: Buffer[] = []
      res.on('data', (chunk: Buffer) => chunks.push(chunk))
      res.on('error', reject)
      res.on('end', () => {
        if (res.statusCode !== 200) reject(new Error(`GET answered ${String(res.statusCode)}`))
        else resolve({ raw: Buffer.concat(chunks), etag: res.headers.etag ?? '', encoding: res.headers['content-encoding'] })
      })
    }).on('error', reject)
  })
}

async function metricValue (server: RunningServer, line: string): Promise<number> {
  const text = await (await fetch(server.metricsUrl)).text()
  const found = text.split('\n').find(l => l.startsWith(line))
  return found === undefined ? 0 : Number(found.split(' ').at(-1))
}

async function create (server: RunningServer, name: string): Promise<void> {
  const response = await fetch(`${server.url}/v1/categories`, { method: 'POST', headers: { ...AUTH, 'content-type': 'application/json' }, body: JSON.stringify({ name }) })
  if (response.status !== 201) throw new Error(`create answered ${response.status}`)
}

async function bigList (postgres: Postgres, lines: string[]): Promise<void> {
  const link = makeLink(LINK)
  if (typeof link === 'string') {
    lines.push(`Big list through a ${LINK} link: skipped (${link}).`, '')
    log(`big list skipped: ${link}`)
    return
  }
  const databaseUrl = await postgres.createDatabase(`compression_${runId}_big`)
  const server = await startServer('service', { databaseUrl, logLevel: 'info', workDir: postgres.workDir, label: 'compression-big' })
  const relayed = await relay(link.hostAddress, new URL(server.url))
  try {
    log(`seeding ${BIG_ROWS} rows`)
    await seedLongRows(databaseUrl, BIG_ROWS)
    const identity = await getOnLoopback(server, 'identity')
    log(`the list: ${mb(identity.raw.length)}`)
    lines.push(`Big list: ${BIG_ROWS} rows, ${mb(identity.raw.length)} of JSON, through a veth pair shaped with tc tbf rate ${LINK} (curl in a network namespace; time to the last byte, the body not decoded)`, '',
      '| coding | GET | bytes on the wire | first byte | last byte | service CPU |', '|---|---|---:|---:|---:|---:|')
    const row = (coding: Coding, what: string, t: Transfer, cpu: number): void => {
      lines.push(`| ${coding} | ${what} | ${mb(t.bytes)} | ${t.firstByteMs.toFixed(0)} ms | ${t.totalMs.toFixed(0)} ms | ${cpu.toFixed(2)} s |`)
      log(`${coding} ${what}: ${mb(t.bytes)} in ${t.totalMs.toFixed(0)} ms (first byte ${t.firstByteMs.toFixed(0)} ms)`)
    }
    const timed = async (coding: Coding, what: string): Promise<void> => {
      const before = cpuSeconds(server.pid)
      const transfer = await curlInNamespace(link, relayed.port, coding)
      row(coding, what, transfer, cpuSeconds(server.pid) - before)
    }
    for (const coding of CODINGS) {
      await timed(coding, coding === 'identity' ? 'first (the list cached already)' : 'first of this coding (compressed now)')
      await timed(coding, 'next (compressed already)')
    }
    await create(server, `compression-bench-${runId}`)
    for (const coding of ['gzip', 'br'] as const) await timed(coding, 'first after a create (a new version compressed)')

    // Every compressed body decodes to the identity body: its SHA-1 is the identity ETag.
    const fresh = await getOnLoopback(server, 'identity')
    const sha1 = createHash('sha1').update(fresh.raw).digest('base64url')
    for (const coding of ['gzip', 'br'] as const) {
      const got = await getOnLoopback(server, coding)
      const decoded = coding === 'gzip' ? await promisify(gunzip)(got.raw) : await promisify(brotliDecompress)(got.raw)
      const ok = got.encoding === coding && createHash('sha1').update(decoded).digest('base64url') === sha1 && got.etag === `W/"${sha1}-${coding}"`
      if (!ok) throw new Error(`the ${coding} body does not decode to the list`)
      lines.push(`| ${coding} | decoded here: the identity body's SHA-1 | ${mb(decoded.length)} | | | |`)
    }
    const counts = await Promise.all(['gzip', 'br'].map(async c => await metricValue(server, `categories_list_compressions_total{encoding="${c}"}`)))
    // Per coding: first, next and first after a create through the link, and the check here: two versions.
    lines.push('', `categories_list_compressions_total: gzip ${counts[0] ?? 0}, br ${counts[1] ?? 0}, for 4 GETs of each coding over two list versions`, '')
  } catch (err) {
    // The service's own account of what went wrong, before its temporary directory goes.
    log(`failed; the service's last log lines:\n${(await readFile(server.logFile, 'utf8').catch(() => '')).split('\n').slice(-20).join('\n')}`)
    throw err
  } finally {
    await relayed.close()
    link.remove()
    await server.stop()
  }
}

async function perRequestCpu (postgres: Postgres, lines: string[]): Promise<void> {
  const databaseUrl = await postgres.createDatabase(`compression_${runId}_small`)
  const server = await startServer('service', { databaseUrl, logLevel: 'warn', workDir: postgres.workDir, label: 'compression-small' })
  const load = await startLoadGenerator(log)
  try {
    await seedBySql(databaseUrl, 100)
    const byCoding: Record<Coding, Array<{ rps: number, cpuUs: number, bytes: number }>> = { identity: [], gzip: [], br: [] }
    for (let round = 0; round < ROUNDS; round++) {
      for (const coding of CODINGS) {
        let before = 0
        const result = await load.run({
          url: server.url,
          kind: 'get',
          path: '/v1/categories',
          headers: { ...AUTH, ...acceptFor(coding) },
          connections: 16,
          durationS: DURATION_S,
          warmupS: 2,
          rate: 0,
          postEvery: 0,
          namePrefix: ''
        }, () => { before = cpuSeconds(server.pid) })
        const cpu = cpuSeconds(server.pid) - before
        if (result.socketErrors > 0 || (result.statusCounts['4xx-5xx'] ?? 0) > 0) throw new Error(`${coding}: errors under load`)
        byCoding[coding].push({ rps: result.rps, cpuUs: cpu / result.total * 1e6, bytes: result.bytesPerResponse })
        log(`round ${round + 1} ${coding}: ${result.rps.toFixed(0)} req/s, ${(cpu / result.total * 1e6).toFixed(1)} µs CPU per request, ${result.bytesPerResponse} bytes per response`)
      }
    }
    lines.push(`The 100-row list: wrk, 16 connections, ${DURATION_S} s per coding and round, ${ROUNDS} rounds interleaved (medians); service CPU seconds over requests answered`, '',
      '| coding | requests/s | service CPU per request | bytes per response (headers included) |', '|---|---:|---:|---:|')
    for (const coding of CODINGS) {
      const runs = byCoding[coding]
      lines.push(`| ${coding} | ${median(runs.map(r => r.rps)).toFixed(0)} | ${median(runs.map(r => r.cpuUs)).toFixed(1)} µs | ${median(runs.map(r => r.bytes))} |`)
    }
    const compressions = await Promise.all(['gzip', 'br'].map(async c => await metricValue(server, `categories_list_compressions_total{encoding="${c}"}`)))
    lines.push('', `categories_list_compressions_total after every round: gzip ${compressions[0] ?? 0}, br ${compressions[1] ?? 0}`)
  } finally {
    await load.stop()
    await server.stop()
  }
}

async function main (): Promise<void> {
  const postgres = await startPostgres()
  log(`PostgreSQL ${postgres.version} (${postgres.source})`)
  const lines: string[] = []
  try {
    await bigList(postgres, lines)
    await perRequestCpu(postgres, lines)
  } finally {
    await postgres.stop()
  }
  process.stdout.write(lines.join('\n') + '\n')
}

await runToExit(main)
