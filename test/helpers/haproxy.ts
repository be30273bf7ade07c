import { execFileSync, spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { ensureDebianPackage } from './debian-package.js'

/*
 * A real HAProxy (Debian's package, installed when missing) balancing HTTP round-robin over
 * servers on loopback, configured as docs/deployment.md recommends for the service: health
 * checks on /health/ready, retries only where a request cannot have reached an instance.
 */

export interface HAProxy {
  url: string
  version: string
  /** Each server's row of the stats CSV (status, stot, wretr, wredis, ...), in the order of the ports given. */
  servers: () => Promise<Array<Record<string, string>>>
  /** Everything HAProxy wrote. */
  log: () => string
}

interface Teardown { teardown: (fn: () => Promise<void> | void) => void }

const START_LIMIT_MS = 10_000

/** The server names in the configuration and the stats: s1, s2, ... */
const serverName = (index: number): string => `s${index + 1}`

// Checks every 500 ms, down after one failure: well inside the service's drain, which the caller sets longer.
function configuration (port: number, statsPort: number, serverPorts: number[]): string {
  return `global
  maxconn 4096

defaults
  mode http
  timeout connect 2s
  timeout client 30s
  timeout server 30s
  timeout http-keep-alive 30s
  timeout check 1s
  option http-keep-alive
  # Retried only when a request cannot have reached an instance, or, but for a POST,
  # when the instance closed without answering.
  retries 3
  retry-on conn-failure empty-response
  option redispatch 1

frontend stats
  bind 127.0.0.1:${statsPort}
  stats enable
  stats uri /stats

frontend public
  bind 127.0.0.1:${port}
  http-request set-header X-Request-Id %[uuid()] unless { req.hdr(x-request-id) -m found }
  option forwardfor
  default_backend api

backend api
  balance roundrobin
  http-request disable-l7-retry if METH_POST
  option httpchk GET /health/ready
  http-check expect status 200
  default-server check inter 500ms fall 1 rise 2
${serverPorts.map((serverPort, i) => `  server ${serverName(i)} 127.0.0.1:${serverPort}`).join('\n')}
`
}

function parseCsv (csv: string): Array<Record<string, string>> {
  const [header = '', ...lines] = csv.trim().split('\n')
  const columns = header.replace(/^# /, '').split(',')
  return lines.map(line => Object.fromEntries(line.split(',').map((value, i) => [columns[i] ?? '', value])))
}

/** HAProxy on 127.0.0.1:`port`, its stats on `statsPort`; stopped at teardown. */
export async function startHAProxy (t: Teardown, port: number, statsPort: number, serverPorts: number[]):
Promise<HAProxy> {
  const version = ensureDebianPackage('haproxy', ['-v'])
  const dir = await mkdtemp(path.join(tmpdir(), 'petstore-haproxy-'))
  const file = path.join(dir, 'haproxy.cfg')
  await writeFile(file, configuration(port, statsPort, serverPorts), { mode: 0o600 })
  execFileSync('haproxy', ['-c', '-q', '-f', file])
  const child = spawn('haproxy', ['-db', '-f', file], { stdio: ['ignore', 'pipe', 'pipe'] })
  let output = ''
  const append = (chunk: Buffer): void => { output += chunk.toString() }
  child.stdout.on('data', append)
  child.stderr.on('data', append)
  const exited = once(child, 'exit')
  t.teardown(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM')
      await exited
    }
    await rm(dir, { recursive: true, force: true })
  })

  const servers = async (): Promise<Array<Record<string, string>>> => {
    const rows = parseCsv(await (await fetch(`http://127.0.0.1:${statsPort}/stats;csv`)).text())
    return serverPorts.map((_, i) => rows.find(row => row.pxname === 'api' && row.svname === serverName(i)) ?? {})
  }
  const deadline = Date.now() + START_LIMIT_MS
  for (;;) {
    if (child.exitCode !== null) throw new Error(`haproxy exited: ${output}`)
    const answered = await servers().then(() => true, () => false)
    if (answered) break
    if (Date.now() > deadline) throw new Error(`haproxy's stats did not answer within ${START_LIMIT_MS} ms: ${output}`)
    await sleep(100)
  }
  return { url: `http://127.0.0.1:${port}`, version, servers, log: () => output }
}
