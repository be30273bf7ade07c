import pg from 'pg'
import type { Test } from 'tap'

/** One connection to `url` for `work`, ended afterwards whatever happens. */
export async function withClient<T> (
  url: string,
  work: (client: pg.Client) => Promise<T>,
  options: Omit<pg.ClientConfig, 'connectionString'> = {}
): Promise<T> {
  const client = new pg.Client({ ...options, connectionString: url })
  await client.connect()
  try {
    return await work(client)
  } finally {
    await client.end()
  }
}

/** The pid of a backend of the service (application_name petstore/…) that waits for a lock, if one does. */
export async function lockWaiter (client: pg.ClientBase): Promise<number | undefined> {
  // A transaction reads pg_stat_activity's list of backends once: a locker inside one would not see new ones.
  await client.query('SELECT pg_stat_clear_snapshot()')
  const { rows } = await client.query<{ pid: number }>(
    "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'petstore/%' AND wait_event_type = 'Lock'")
  return rows[0]?.pid
}

/**
 * A session of its own holding a lock on categories until it commits or rolls back, ended at teardown. EXCLUSIVE:
 * writes wait, reads do not; ACCESS EXCLUSIVE: reads wait too.
 */
export async function lockCategories (t: Test, url: string, mode: 'EXCLUSIVE' | 'ACCESS EXCLUSIVE'):
Promise<pg.Client> {
  const locker = new pg.Client({ connectionString: url })
  await locker.connect()
  t.teardown(async () => {
    await locker.end()
  })
  // It connects as the service's role, whose short DB_STATEMENT_TIMEOUT_MS in a test would cut the locker's own
  // statements short on a loaded machine (pg does not send a statement_timeout of 0).
  await locker.query('SET statement_timeout = 0')
  await locker.query('BEGIN')
  await locker.query(`LOCK TABLE categories IN ${mode} MODE`)
  return locker
}
