import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import net from 'node:net'
import { freePort } from '../../helpers/ports.js'

/*
 * Ports for clusters, proxies and instances. With TOPOLOGY_PORTS=FROM-TO
 * (a range the machine's owner gave this run) ports come from that range,
 * skipping any in use or claimed by an existing PostgreSQL cluster (a stopped
 * one does not listen but owns its port); without it, ports below the kernel's
 * ephemeral range (belowEphemeral). Test files run one at a time (see scripts/test-topology.sh).
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

/**
 * Without TOPOLOGY_PORTS, ports below the kernel's ephemeral range (Linux: 20768-32767
 * with its default 32768-60999). A port from that range, which is what listen(0) hands
 * out, can be taken between the moment it is handed out and the moment an instance binds
 * it, as the local port of any outgoing connection (the load's, PgBouncer's, a cluster's
 * replication): the instance then exits with "PORT … is already in use". Elsewhere, or
 * with a range too low to leave room, free ports from the system.
 */
function belowEphemeral (): [number, number] | undefined {
  let first: number
  try {
    first = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0])
  } catch {
    return undefined
  }
  return Number.isInteger(first) && first > 13024 ? [first - 12000, first - 1] : undefined
}

/** The first of `candidates` that is not handed out, not a cluster's, and free now; handed out. */
async function claimFirst (candidates: Iterable<number>): Promise<number | undefined> {
  const claimed = clusterPorts()
  for (const port of candidates) {
    if (handedOut.has(port) || claimed.has(port) || await inUse(port)) continue
    handedOut.add(port)
    return port
  }
  return undefined
}

function * randomIn (from: number, to: number, count: number): Generator<number> {
  for (let i = 0; i < count; i++) yield from + Math.floor(Math.random() * (to - from + 1))
}

function * inOrder (from: number, to: number): Generator<number> {
  for (let port = from; port <= to; port++) yield port
}

export async function nextPort (): Promise<number> {
  const range = process.env.TOPOLOGY_PORTS
  if (range === undefined || range === '') {
    const below = belowEphemeral()
    if (below === undefined) {
      const port = await freePort()
      handedOut.add(port)
      return port
    }
    const port = await claimFirst(randomIn(below[0], below[1], 500))
    if (port === undefined) throw new Error(`no free port found in ${below[0]}-${below[1]}; set TOPOLOGY_PORTS`)
    return port
  }
  const match = /^(\d+)-(\d+)$/.exec(range)
  if (match === null) throw new Error(`TOPOLOGY_PORTS must look like 6400-6449, not ${range}`)
  const port = await claimFirst(inOrder(Number(match[1]), Number(match[2])))
  if (port === undefined) throw new Error(`no free port left in TOPOLOGY_PORTS=${range}`)
  return port
}
