import type pg from 'pg'
import { COMMIT_NOT_REPLICATED, DATABASE_IN_RECOVERY } from './errors.js'

/*
 * What the service checks on every connection it opens (the pool's and the
 * change feed's), so that a failover cannot make it serve from the wrong server:
 *
 * - A standby in recovery is refused: it refuses writes, and its reads may lag
 *   the primary (a list could miss a create already answered 201).
 * - The server is identified by its postmaster's start time. The newest
 *   connection says where the database address leads now; when that is another
 *   server than before, every connection to the old one is stale: the pool's are
 *   closed as they come back (db/database.ts), the change feed reconnects
 *   (onMove). After a failover that moved the address without cutting sessions
 *   (a DNS change, a balancer without shutdown-sessions), they would read data
 *   the new primary does not have, and a feed left there would hear nothing.
 * - A commit whose wait for the synchronous standby was cancelled is committed
 *   on this server only; PostgreSQL reports success with a warning.
 *   confirmReplicated() turns that into an error: the outcome is unknown.
 */

// PostgreSQL's warning (src/backend/replication/syncrep.c) when a commit stops waiting for its standby.
const SYNC_WAIT_CANCELED = /^canceling (the )?wait for synchronous replication/

/** Opens one new connection to the database address, as the pool would. */
export type OpenConnection = () => Promise<pg.Client>

type Log = (fields: object, message: string) => void

/** Errors after which a statement's outcome is unknown: its client-side timeout, an unconfirmed commit. */
export function outcomeUnknown (err: unknown): boolean {
  return err instanceof Error && ((err as { code?: unknown }).code === COMMIT_NOT_REPLICATED || err.message === 'Query read timeout')
}

export class DatabaseServers {
  /** The server the newest connection reached. */
  private current: string | undefined
  private readonly serverOf = new WeakMap<pg.ClientBase, string>()
  private readonly unreplicated = new WeakSet<pg.ClientBase>()
  private readonly moveListeners: Array<() => void> = []
  private rechecking = false

  constructor (private readonly log: Log = () => {}) {}

  /** Checks a new connection (pg-pool's onConnect, the change feed after connecting); throws for a standby. */
  register = async (client: pg.ClientBase): Promise<void> => {
    const { rows } = await client.query<{ standby: boolean, server: string }>('SELECT pg_is_in_recovery() AS standby, extract(epoch FROM pg_postmaster_start_time())::text AS server')
    const row = rows[0]
    if (row === undefined || row.standby) throw Object.assign(new Error('the database server is a standby in recovery'), { code: DATABASE_IN_RECOVERY })
    client.on('notice', (notice: { message?: string }) => { if (SYNC_WAIT_CANCELED.test(notice.message ?? '')) this.unreplicated.add(client) })
    this.serverOf.set(client, row.server)
    if (row.server === this.current) return
    const previous = this.current
    this.current = row.server
    if (previous === undefined) return
    this.log({ previous, server: row.server }, 'the database address leads to another server now (a failover or a restart): closing the connections to the old one')
    for (const listener of this.moveListeners) listener()
  }

  /** True for a connection to a server the address no longer leads to. */
  isStale (client: pg.ClientBase): boolean {
    const server = this.serverOf.get(client)
    return server !== undefined && server !== this.current
  }

  /** Called whenever a new connection finds that the address leads to another server. */
  onMove (listener: () => void): void {
    this.moveListeners.push(listener)
  }

  /** Throws when a commit on this client was not confirmed by the synchronous standby. */
  confirmReplicated (client: pg.ClientBase): void {
    if (this.unreplicated.has(client)) {
      throw Object.assign(new Error('the commit was not confirmed by the synchronous standby (its outcome is unknown)'), { code: COMMIT_NOT_REPLICATED })
    }
  }

  /**
   * After a statement whose outcome is unknown (outcomeUnknown): one new connection asks where the address
   * leads now. After a failover that moved it without cutting sessions, the pool's other connections still
   * lead to the old primary, whose commits wait for a standby that is gone; without this each of them would
   * hang a request for a whole statement timeout. One recheck at a time; a failed one changes nothing.
   */
  recheck (open: OpenConnection): void {
    if (this.rechecking) return
    this.rechecking = true
    const check = async (): Promise<void> => {
      const client = await open()
      try {
        await this.register(client)
      } finally {
        await client.end().catch(() => {})
      }
    }
    check().catch(() => {}).finally(() => { this.rechecking = false })
  }
}
