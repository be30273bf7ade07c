import type pg from 'pg'

/*
 * What the service checks on every connection it opens (the pool's and the
 * change feed's), so that a failover cannot make it serve from the wrong
 * server:
 *
 * - A standby in recovery is refused: it refuses writes, and its reads may lag
 *   the primary (a list could miss a create already answered 201).
 * - The server is identified (by its postmaster's start time). The newest
 *   connection says where the service's address leads now; when it reaches
 *   another server than before, every connection still open to the old one is
 *   closed. After a failover that moved the address without cutting sessions
 *   (a DNS change, a balancer without shutdown-sessions), those would read data
 *   the new primary does not have, and a change feed left there would never
 *   hear of the new primary's changes.
 * - A commit whose wait for the synchronous standby was cancelled (the
 *   statement timeout, when the standby is gone) is committed on this server
 *   only; PostgreSQL reports success with a warning. confirmReplicated() turns
 *   that into an error: the create's outcome is unknown, never acknowledged.
 */

/** Thrown (a 503, see db/errors.ts) when the server reached is a standby in recovery. */
export const DATABASE_IN_RECOVERY = 'EDBINRECOVERY'
/** Thrown (a 503) by confirmReplicated when a commit was not confirmed by the synchronous standby. */
export const COMMIT_NOT_REPLICATED = 'ECOMMITNOTREPLICATED'

// PostgreSQL's warning (src/backend/replication/syncrep.c) when a commit stops waiting for its standby.
const SYNC_WAIT_CANCELED = /^canceling (the )?wait for synchronous replication/
const unreplicated = new WeakSet<pg.ClientBase>()

/** Throws when a commit on this client was not confirmed by the synchronous standby; the client must then be released with the error (closed). */
export function confirmReplicated (client: pg.ClientBase): void {
  if (unreplicated.has(client)) {
    throw Object.assign(new Error('the commit was not confirmed by the synchronous standby (its outcome is unknown)'), { code: COMMIT_NOT_REPLICATED })
  }
}

/** Ends a connection at once, whatever it is doing: its query in flight fails as a lost connection. */
function cut (client: pg.ClientBase): void {
  (client as unknown as { connection?: { stream?: { destroy: () => void } } }).connection?.stream?.destroy()
}

/** Opens one new connection to the database address, as the pool would. */
export type OpenConnection = () => Promise<pg.Client>

/** Errors after which a statement's outcome is unknown and its connection is closed: its client-side timeout, an unconfirmed commit. */
export function outcomeUnknown (err: unknown): boolean {
  return err instanceof Error && ((err as { code?: unknown }).code === COMMIT_NOT_REPLICATED || err.message === 'Query read timeout')
}

export class DatabaseServers {
  /** The server the newest connection reached. */
  private current: string | undefined
  private rechecking = false
  /** Every open connection checked here, and its server. */
  private readonly open = new Map<pg.ClientBase, string>()

  constructor (private readonly log?: (fields: object, message: string) => void) {}

  /** Checks a new connection (pg-pool's onConnect, the change feed after connecting); throws for a standby. */
  register = async (client: pg.ClientBase): Promise<void> => {
    const { rows } = await client.query<{ standby: boolean, server: string }>('SELECT pg_is_in_recovery() AS standby, extract(epoch FROM pg_postmaster_start_time())::text AS server')
    const row = rows[0]
    if (row === undefined || row.standby) throw Object.assign(new Error('the database server is a standby in recovery'), { code: DATABASE_IN_RECOVERY })
    client.on('notice', (notice: { message?: string }) => { if (SYNC_WAIT_CANCELED.test(notice.message ?? '')) unreplicated.add(client) })
    client.once('end', () => { this.open.delete(client) })
    this.open.set(client, row.server)
    if (row.server === this.current) return
    const previous = this.current
    this.current = row.server
    if (previous === undefined) return
    let closed = 0
    for (const [other, server] of this.open) {
      if (server === row.server) continue
      cut(other)
      this.open.delete(other)
      closed++
    }
    this.log?.({ previous, server: row.server, closed }, 'the database address leads to another server now (a failover or a restart): closed the connections to the old one')
  }

  /**
   * After a statement whose outcome is unknown (see outcomeUnknown): one new connection asks where the
   * address leads now, and register() closes every connection to the old server if it moved. After a
   * failover that moved the address without cutting sessions, the pool's other connections still lead to
   * the old primary, whose commits wait for a standby that is gone; without this each of them would hang
   * a commit for a whole statement timeout before the pool opened a connection to the new primary.
   * One recheck at a time; a failed one (a standby, nothing answering) changes nothing.
   */
  recheck = (open: OpenConnection): void => {
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
