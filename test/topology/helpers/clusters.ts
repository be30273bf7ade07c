import { execFile } from 'node:child_process'
import { existsSync, readdirSync } from 'node:fs'
import { rm, writeFile } from 'node:fs/promises'
import { setTimeout as sleep } from 'node:timers/promises'
import { promisify } from 'node:util'
import pg from 'pg'
import { withClient } from '../../helpers/pg-client.js'
import { nextPort } from './ports.js'

/*
 * Real PostgreSQL clusters from Debian's packages (postgresql-common), created
 * and removed by the tests themselves: `pg_createcluster` on ports of our own,
 * a streaming standby by `pg_basebackup -R`, synchronous replication,
 * `pg_ctlcluster ... stop|start|promote`. Needs root. Never touches a cluster
 * it did not create: every name starts with petstore_topo_<pid>_.
 *
 *   const primary = await DebianCluster.create(t, 'primary')
 *   const standby = await primary.createStandby(t, 'standby')
 *   await primary.requireSynchronousStandby()
 *   await primary.stop('immediate'); await standby.promote()
 */

const run = promisify(execFile)
const PREFIX = 'petstore_topo_'

interface Teardown {
  teardown: (fn: () => Promise<void> | void) => void
}

/** The newest PostgreSQL major installed from Debian's packages. */
function installedVersion (): string {
  const dir = '/usr/lib/postgresql'
  const versions = existsSync(dir)
    ? readdirSync(dir)
      .filter(v => /^\d+$/.test(v))
      .sort((a, b) => Number(b) - Number(a))
    : []
  if (versions[0] === undefined || !existsSync('/usr/bin/pg_createcluster')) {
    throw new Error(
      "Debian's PostgreSQL packages are missing: " +
        'apt-get install postgresql postgresql-common (scripts/test-topology.sh does)'
    )
  }
  return versions[0]
}

async function command (file: string, args: string[]): Promise<string> {
  try {
    return (await run(file, args, { encoding: 'utf8' })).stdout
  } catch (err) {
    const { stderr, stdout } = err as { stderr?: string; stdout?: string }
    throw new Error(`${file} ${args.join(' ')} failed: ${stderr ?? ''}${stdout ?? ''}`.trim(), { cause: err })
  }
}

function isAlive (pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

let swept = false
/** Clusters left by an earlier run that was killed before its teardown (its pid is gone). */
async function sweepOrphans (version: string): Promise<void> {
  if (swept) return
  swept = true
  const out = await command('pg_lsclusters', ['--no-header'])
  for (const line of out.split('\n')) {
    const [ver, name] = line.trim().split(/\s+/)
    const pid = new RegExp(`^${PREFIX}(\\d+)_`).exec(name ?? '')?.[1]
    if (ver !== version || name === undefined || pid === undefined || isAlive(Number(pid))) continue
    await command('pg_dropcluster', ['--stop', version, name]).catch(() => {})
    await rm(`/etc/postgresql/${version}/${name}`, { recursive: true, force: true })
  }
}

export class DebianCluster {
  private constructor (
    readonly version: string,
    readonly name: string,
    readonly port: number
  ) {}

  /** A new primary cluster on a port of our own, started. `settings` go into its conf.d (not into the data directory,
   * so a standby does not copy them). */
  static async create (t: Teardown, role: string, settings: Record<string, string> = {}): Promise<DebianCluster> {
    const version = installedVersion()
    await sweepOrphans(version)
    const cluster = await DebianCluster.make(t, version, role)
    await cluster.configure(settings)
    await cluster.start()
    return cluster
  }

  /** The admin connection string of database `database`. */
  url (database = 'postgres'): string {
    return `postgres://postgres@127.0.0.1:${this.port}/${database}`
  }

  get configDir (): string {
    return `/etc/postgresql/${this.version}/${this.name}`
  }

  get dataDir (): string {
    return `/var/lib/postgresql/${this.version}/${this.name}`
  }

  async start (): Promise<void> {
    await command('pg_ctlcluster', [this.version, this.name, 'start'])
  }

  /** `fast` ends every session (57P01) and shuts down cleanly; `immediate` is a crash: no checkpoint, connections cut.
   * */
  async stop (mode: 'fast' | 'immediate' = 'fast'): Promise<void> {
    await command('pg_ctlcluster', [this.version, this.name, 'stop', '-m', mode])
  }

  /** Ends recovery: the standby becomes a primary (waits until it is). */
  async promote (): Promise<void> {
    await command('pg_ctlcluster', [this.version, this.name, 'promote'])
  }

  async drop (): Promise<void> {
    await command('pg_dropcluster', ['--stop', this.version, this.name]).catch(() => {})
    // pg_dropcluster leaves files it did not create (our conf.d file) behind.
    await rm(this.configDir, { recursive: true, force: true })
  }

  /** A streaming standby of this cluster (pg_basebackup -R), started and in recovery. */
  async createStandby (t: Teardown, role: string): Promise<DebianCluster> {
    const standby = await DebianCluster.make(t, this.version, role)
    // Replace the fresh data directory's content (the directory itself stays: its parent belongs to root).
    for (const entry of readdirSync(standby.dataDir)) {
      await rm(`${standby.dataDir}/${entry}`, { recursive: true, force: true })
    }
    await command('runuser', [
      '-u',
      'postgres',
      '--',
      'pg_basebackup',
      '-h',
      '127.0.0.1',
      '-p',
      String(this.port),
      '-U',
      'postgres',
      '-D',
      standby.dataDir,
      '-R',
      '-X',
      'stream',
      '-c',
      'fast'
    ])
    await standby.configure({})
    await standby.start()
    return standby
  }

  /** Every commit waits until the standby has flushed it: what makes a failover lose nothing acknowledged. */
  async requireSynchronousStandby (): Promise<void> {
    await writeFile(`${this.configDir}/conf.d/synchronous.conf`, "synchronous_standby_names = '*'\n")
    await command('pg_ctlcluster', [this.version, this.name, 'reload'])
    for (let i = 0; i < 200; i++) {
      const rows = await this.query<{ sync_state: string }>('SELECT sync_state FROM pg_stat_replication')
      if (rows.some(r => r.sync_state === 'sync')) return
      await sleep(50)
    }
    throw new Error(`${this.name}: no synchronous standby after 10 s`)
  }

  /** One statement on a short-lived connection of its own. */
  async query<R extends pg.QueryResultRow>(text: string, values: unknown[] = [], database = 'postgres'): Promise<R[]> {
    return await withClient(this.url(database), async client => (await client.query<R>(text, values)).rows, {
      connectionTimeoutMillis: 5000
    })
  }

  /** A new cluster, not started, removed when the test ends; trust authentication on loopback (a test machine's own).
   * */
  private static async make (t: Teardown, version: string, role: string): Promise<DebianCluster> {
    const cluster = new DebianCluster(version, `${PREFIX}${process.pid}_${role}`, await nextPort())
    t.teardown(async () => {
      await cluster.drop()
    })
    await command('pg_createcluster', [
      version,
      cluster.name,
      '-p',
      String(cluster.port),
      '--start-conf=manual',
      '--',
      '--auth-local=trust',
      '--auth-host=trust'
    ])
    return cluster
  }

  private async configure (settings: Record<string, string>): Promise<void> {
    const lines = Object.entries({ listen_addresses: "'127.0.0.1'", ...settings }).map(([k, v]) => `${k} = ${v}`)
    await writeFile(`${this.configDir}/conf.d/petstore-topology.conf`, lines.join('\n') + '\n')
  }
}
