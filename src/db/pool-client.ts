import { createHash } from 'node:crypto'
import pg from 'pg'

/*
 * How the pool's connections send each statement, so that the same code works on a
 * direct connection and through a pooler (PgBouncer, RDS Proxy, Supavisor) in any
 * pool mode. docs/deployment.md ("Poolers") has the reasoning and the measurements.
 *
 * statement_timeout, enforced by the server, without a startup parameter. pg's
 * `statement_timeout` option travels as a startup parameter, which PgBouncer
 * refuses ("unsupported startup parameter"), or ignores when told to (the timeout is
 * then silently gone). A session-level SET does not survive transaction pooling, and
 * a role- or database-level default is the operator's to set, not ours. So every
 * statement carries its own timeout: in the same round trip and the same Sync, it
 * is preceded by a settings statement, `SELECT set_config('statement_timeout',
 * <ms>, true), set_config('application_name', <writer>, true)`. Both run in
 * one transaction (the implicit one that lasts until Sync, or the caller's explicit
 * one), which a pooler keeps on one server connection; the setting is local to that
 * transaction, and PostgreSQL arms the timer when the next statement starts, so the
 * real statement (its Parse included) runs under it. Nothing outlives the
 * transaction, so nothing leaks to the next client of a pooled server connection.
 * Transaction control (BEGIN, COMMIT, ROLLBACK...) is sent as it is: in a failed
 * transaction any other statement is refused, and ROLLBACK must still get through.
 *
 * application_name, set the same way. The change notifications name the writer by
 * it (migrations: categories-notify-writer), so that an instance skips the echo of
 * its own creates. A pooler that kept another client's name on a server connection
 * would make an instance skip a change it did not make; set locally in each
 * transaction, the name is always the writer's, whatever the pooler passes on.
 *
 * Prepared statements, only when asked for (DB_PREPARED_STATEMENTS). A statement
 * prepared under a name lives on one server connection; behind a transaction pooler
 * the next transaction may run on a server connection that has never seen the name,
 * or has seen it from another client ("prepared statement ... does not exist /
 * already exists"). Off, every statement is unnamed (parsed and planned each time);
 * on, each statement with parameters is prepared once per connection under a name
 * derived from its text, so callers never name statements themselves.
 */

const STATEMENT_SETTINGS = "SELECT set_config('statement_timeout', $1, true), set_config('application_name', $2, true)"
/** The settings statement's own name when statements are prepared: it then costs a Bind and an Execute, not a Parse and a plan, per statement. */
const STATEMENT_SETTINGS_NAME = 'petstore_statement_settings'
const TRANSACTION_CONTROL = /^\s*(BEGIN|START|COMMIT|END|ROLLBACK|ABORT|SAVEPOINT|RELEASE|PREPARE\s+TRANSACTION)\b/i
/** Distinct statement texts given a name; beyond this (generated SQL?) statements stay unnamed rather than pile up on every connection. */
const MAX_NAMED_STATEMENTS = 200

export interface PoolClientOptions {
  statementTimeoutMs: number
  preparedStatements: boolean
  applicationName: string
}

/** What pg's Connection offers a query to write its messages with, and its record of named statements sent (pg 8.2x, lib/connection.js). */
interface ProtocolWriter {
  parse: (message: { text: string, name: string }) => void
  bind: (message: { portal: string, statement: string, values: unknown[] }) => void
  execute: (message: { portal: string, rows: number }) => void
  parsedStatements: Record<string, string | undefined>
  submittedNamedStatements: Record<string, string | undefined>
}

type Callback = (err: Error | null, result?: pg.QueryResult) => void

/** The parts of pg's Query (lib/query.js) that this extends: how it writes its messages, and how it takes the answers. */
interface QueryInternals {
  text: string | undefined
  values: unknown[] | undefined
  name: string | undefined
  callback: Callback | undefined
  queryMode: string | undefined
  prepare (connection: ProtocolWriter): void
  handleDataRow (message: unknown): void
  handleCommandComplete (message: unknown, connection: ProtocolWriter): void
  handleError (err: Error, connection: ProtocolWriter): void
}
const PgQuery = pg.Query as unknown as new (config: unknown, values?: unknown, callback?: Callback) => QueryInternals

/** A query whose messages are preceded by the settings statement's; its answer (one row, one CommandComplete) is swallowed. */
class QueryWithSettings extends PgQuery {
  private settingsAnswered = false
  /**
   * pg's client records the active query's name as parsed on any ParseComplete;
   * the first one may be the settings statement's. So until that has answered, the
   * query goes by the settings statement's name (or none), and if it fails, the real
   * Parse never ran: pg's record that it was sent is removed, or the next use would
   * skip it.
   */
  private hiddenName: string | undefined

  /** `settings`: the settings statement's values and name ('' for unnamed); `name`: the name for a statement's text, if any. */
  constructor (config: unknown, values: unknown, callback: Callback | undefined, private readonly settings: { values: string[], name: string }, name: (text: string) => string | undefined) {
    super(config, values, callback)
    this.name = this.text !== undefined && (this.values?.length ?? 0) > 0 ? name(this.text) : undefined
    // Always Parse/Bind/Execute, even without parameters: a simple Query message would end the Sync too early.
    this.queryMode = 'extended'
  }

  override prepare (connection: ProtocolWriter): void {
    const { values, name } = this.settings
    if (name === '' || connection.parsedStatements[name] === undefined) connection.parse({ text: STATEMENT_SETTINGS, name })
    connection.bind({ portal: '', statement: name, values })
    connection.execute({ portal: '', rows: 0 })
    super.prepare(connection)
    this.hiddenName = this.name
    this.name = name === '' ? undefined : name
  }

  override handleDataRow (message: unknown): void {
    if (this.settingsAnswered) super.handleDataRow(message)
  }

  override handleCommandComplete (message: unknown, connection: ProtocolWriter): void {
    if (this.settingsAnswered) {
      super.handleCommandComplete(message, connection)
      return
    }
    this.settingsAnswered = true
    this.name = this.hiddenName
  }

  override handleError (err: Error, connection: ProtocolWriter): void {
    if (!this.settingsAnswered && this.hiddenName !== undefined) {
      delete connection.submittedNamedStatements[this.hiddenName]
      this.name = this.hiddenName
    }
    super.handleError(err, connection)
  }
}

function queryText (config: unknown): string {
  if (typeof config === 'string') return config
  const text = (config as { text?: unknown } | undefined)?.text
  return typeof text === 'string' ? text : ''
}

/** A pg.Client class for pg.Pool's `Client` option: every statement under the timeout and the writer's name, prepared or not as configured. */
export function poolClientClass ({ statementTimeoutMs, preparedStatements, applicationName }: PoolClientOptions): typeof pg.Client {
  const settings = { values: [String(statementTimeoutMs), applicationName], name: preparedStatements ? STATEMENT_SETTINGS_NAME : '' }
  const names = new Map<string, string>()
  const name = (text: string): string | undefined => {
    if (!preparedStatements) return undefined
    let known = names.get(text)
    if (known === undefined && names.size < MAX_NAMED_STATEMENTS) {
      known = `petstore_${createHash('sha256').update(text).digest('hex').slice(0, 24)}`
      names.set(text, known)
    }
    return known
  }
  return class PoolClient extends pg.Client {
    // One signature for all of pg's overloads (text, config, submittable; callback or promise): `never` fits each return type.
    override query (config: unknown, values?: unknown, callback?: unknown): never {
      const base = super.query.bind(this) as (...args: unknown[]) => unknown
      const submittable = typeof (config as { submit?: unknown } | undefined)?.submit === 'function'
      if (submittable || TRANSACTION_CONTROL.test(queryText(config))) return base(config, values, callback) as never
      if (typeof values === 'function') [values, callback] = [undefined, values]
      const query = new QueryWithSettings(config, values, callback as Callback | undefined, settings, name)
      if (query.callback !== undefined) return base(query) as never
      return new Promise<pg.QueryResult>((resolve, reject) => {
        query.callback = (err, result) => { if (err === null || err === undefined) resolve(result as pg.QueryResult); else reject(err) }
        base(query)
      }) as never
    }
  }
}
