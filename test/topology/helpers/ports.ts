import { execFileSync } from 'node:child_process'
import net from 'node:net'
import { freePort } from '../../helpers/ports.js'

/*
 * Ports for clusters, proxies and instances. With TOPOLOGY_PORTS=FROM-TO
 * (a range the machine's owner gave this run) ports come from that range,
 * skipping any in use or claimed by an existing PostgreSQL cluster (a stopped
 * one does not listen but owns its port); without it, free ports from the
 * system. Test files run one at a time (see scripts/test-topology.sh).
 */

const handedOut = new Set<number>()

async function inUse (port: number): Promise<boolean> {
  return await new Promise(resolve => {
    const probe = net.createServer()
    probe.once('error', () => { resolve(true) })
    probe.listen(port, '127.0.0.1', () => { probe.close(() => { resolve(false) }) })
  })
}

/** Ports of every cluster pg_lsclusters knows, running or not. */
function clusterPorts (): Set<number> {
  try {
    const out = execFileSync('pg_lsclusters', ['--no-header'], { encoding: 'utf8' })
    return new Set(out.split('\n').map(line => Number(line.trim().split(/\s+/)[2])).filter(Number.isInteger))
  } catch {
    return new Set()
  }
}

export async function nextPort (): Promise<number> {
  const range = process.env.TOPOLOGY_PORTS
  if (range === undefined || range === '') {
    const port = await freePort()
    handedOut.add(port)
    return port
  }
  const match = /^(\d+)-(\d+)$/.exec(range)
  if (match === null) throw new Error(`TOPOLOGY_PORTS must look like 6400-6449, not ${range}`)
  const claimed = clusterPorts()
  for (let port = Number(match[1]); port <= Number(match[2]); port++) {
    if (handedOut.has(port) || claimed.has(port) || await inUse(port)) continue
    handedOut.add(port)
    return port
  }
  throw new Error(`no free port left in TOPOLOGY_PORTS=${range}`)
}
