import type pg from 'pg'
import { COMMIT_NOT_REPLICATED, DATABASE_IN_RECOVERY } from './errors.js'

// What every connection is checked for, so that a failover cannot make the service serve from the wrong server:
// docs/deployment.md, "Failover and lost connections".

// PostgreSQL's warning (syncrep.c) when a commit stops waiting for its standby.
const SYNC_WAIT_CANCELED = /^canceling (the )?wait for synchronous replication/

/** Errors after which a statement's outcome is unknown: its client-side timeout, an unconfirmed commit. */
export function outcomeUnknown (err: unknown): boolean {
  return err instanceof Error &&
    ((err as { code?: unknown }).code === COMMIT_NOT_REPLICATED || err.message === 'Query read timeout')
}

export class DatabaseServers {
  /** The server the newest connection reached. */
  private current: string | undefined
  private readonly serverOf = new WeakMap<pg.ClientBase, string>()
  private readonly unreplicated = new WeakSet<pg.ClientBase>()
  private readonly moveListeners: Array<() => void> = []
  private rechecking = false

  constructor (private readonly log: (fields: object, message: string) => void) {}

  /** Checks a new connection (pg-pool's onConnect, the change feed's); throws for a standby. */
  register = async (client: pg.ClientBase): Promise<void> => {
    const { rows } = await client.query<{ standby: boolean, server: string }>(
      'SELECT pg_is_in_recovery() AS standby, extract(epoch FROM pg_postmaster_start_time())::text AS server')
    const row = rows[0]
    if (row === undefined || row.standby) {
      throw Object.assign(new Error('the database server is a standby in recovery'), { code: DATABASE_IN_RECOVERY })
    }
    client.on('notice', (notice: { message?: string }) => {
      if (SYNC_WAIT_CANCELED.test(notice.message ?? '')) this.unreplicated.add(client)
    })
    this.serverOf.set(client, row.server)
    const previous = this.current
    this.current = row.server
    if (previous === undefined || previous === row.server) return
    this.log({ previous, server: row.server }, 'the database address leads to another server now (a failover or a ' +
      'restart): closing the connections to the old one')
    for (const listener of this.moveListeners) listener()
  }

  isStale (client: pg.ClientBase): boolean {
    const server = this.serverOf.get(client)
    return server !== undefined && server !== this.current
  }

  /** Called whenever a new connection finds that the address leads to another server. */
  onMove (listener: () => void): void {
    this.moveListeners.push(listener)
  }

  confirmReplicated (client: pg.ClientBase): void {
    if (this.unreplicated.has(client)) {
      throw Object.assign(new Error('the commit was not confirmed by the synchronous standby (its outcome is unknown)'),
        { code: COMMIT_NOT_REPLICATED })
    }
  }

  /**
   * After an unknown outcome, one new connection asks where the address leads now: after a failover that moved
   * it without cutting sessions, each old connection would otherwise hang a request for a whole statement timeout.
   */
  recheck (open: () => Promise<pg.Client>): void {
    if (this.rechecking) return
    this.rechecking = true
    open().then(async client => {
      await this.register(client).finally(async () => { await client.end().catch(() => {}) })
    }).catch(() => {}).finally(() => { this.rechecking = false })
  }
}
