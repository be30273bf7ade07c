import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Test } from 'tap'
import { withClient } from '../../helpers/pg-client.js'
import type { Instances } from './instances.js'

/*
 * The load and the audit every topology test ends with. Reusable as is:
 *
 *   const before = await tableRows(databaseUrl)          // rows that no load created
 *   const load = startLoad(t, { targets: instances.urls, apiKey })
 *   ... break something: terminate backends, fail over, restart a pooler ...
 *   const result = await load.stop()                      // keyed creates are retried to an answer
 *   const figures = await auditLoad(t, result, { databaseUrl, instances, before })
 *
 * Writers send creates round-robin over the targets, most with an
 * Idempotency-Key (a 503 or 409 is retried with the same key and body, on the
 * next target, until it gets its 201: the retry must be answered correctly),
 * the rest without (a 503 is then an unknown outcome: the row may or may not
 * exist). Readers list all categories round-robin and check each 200 against
 * every create acknowledged at least `consistencyMs` before they asked (the
 * contract's cross-instance rule). Any other answer is a problem: a 500, a
 * transport failure (an instance died or hung), an error without the Error
 * body or without Retry-After.
 *
 * The audit asserts: no problem; every key answered; every 201 id in the
 * final table under its name; no row that no client sent; no name stored
 * twice; no stale list; no instance exited before the end; each instance's
 * list equals the table; each instance stops cleanly (exit 0) on SIGTERM
 * (unless the test stops them itself, later).
 */

export interface LoadOptions {
  /** Base URLs of the instances (`http://127.0.0.1:PORT`). */
  targets: string[]
  apiKey: string
  /** Concurrent writers, one create in flight each (default 6). */
  writers?: number
  /** Concurrent list readers (default 4). */
  readers?: number
  /** Share of creates sent with an Idempotency-Key (default 0.75). */
  keyedShare?: number
  /** Pause between a writer's creates and between a reader's lists (ms; defaults 10 and 50). */
  writerPauseMs?: number
  readerPauseMs?: number
  /** Pause before retrying a keyed create that was answered 503 or 409 (ms; default 200). */
  retryPauseMs?: number
  /** A list must hold every create acknowledged this long before it was asked for (ms; default 100). */
  consistencyMs?: number
}

/** One answer (or transport failure) as a client saw it; times from performance.now(). */
export interface Exchange {
  target: number
  op: 'create' | 'list'
  startedAt: number
  endedAt: number
  /** 0 for a transport failure. */
  status: number
}

export interface LoadResult {
  apiKey: string
  exchanges: Exchange[]
  /** Every name a writer sent. */
  sentNames: Set<string>
  /** Acknowledged creates: id → name. */
  acknowledged: Map<number, string>
  /** Keyed creates that never got their 201, even after the load stopped (a stuck key). */
  unansweredKeys: string[]
  /** Keyed creates answered 201 only after at least one retry, and how many of those were replays. */
  retriedKeys: number
  replays: number
  /** When each list that missed a create acknowledged at least consistencyMs before it was asked for was asked for. */
  staleListTimes: number[]
  problems: string[]
  /** Per target: ms from `at` to its first 201 to a create sent at or after `at` (undefined: none). */
  firstCreatedAfter: (at: number) => Array<number | undefined>
}

export interface Load {
  /** As LoadResult's, while the load runs. */
  firstCreatedAfter: (at: number) => Array<number | undefined>
  /** How many creates have had their 201 so far. */
  acknowledgedCount: () => number
  /** Ends the load: no new creates; keyed creates still unanswered are retried (up to 30 s) until they get their 201.
   * */
  stop: () => Promise<LoadResult>
}

interface Answer {
  status: number
  body: string
  retryAfter: string | null
  replayed: boolean
}

const RESOLVE_LIMIT_MS = 30_000

/** Rows of the categories table, ordered by id. */
export async function tableRows (databaseUrl: string): Promise<Array<{ id: number; name: string }>> {
  return await withClient(
    databaseUrl,
    async client =>
      (await client.query<{ id: number; name: string }>('SELECT id::float8 AS id, name FROM categories ORDER BY id'))
        .rows
  )
}

interface Teardown {
  teardown: (fn: () => Promise<void> | void) => void
}

/** Starts the load; it runs until `stop()` (or until the test ends: a test that fails half-way leaves no load behind).
 * */
export function startLoad (t: Teardown, options: LoadOptions): Load {
  const { targets, apiKey } = options
  const consistencyMs = options.consistencyMs ?? 100
  const retryPauseMs = options.retryPauseMs ?? 200
  const runId = `load-${randomBytes(4).toString('hex')}`
  const exchanges: Exchange[] = []
  const sentNames = new Set<string>()
  const acknowledged = new Map<number, string>()
  /** [time acknowledged, id], in the order the 201s arrived. */
  const ackTimes: Array<[number, number]> = []
  const problems: string[] = []
  const unansweredKeys: string[] = []
  const counters = { retriedKeys: 0, replays: 0 }
  const staleListTimes: number[] = []
  const state = { stopping: false, resolveDeadline: Infinity }
  let nextTarget = 0

  async function exchange (
    op: Exchange['op'],
    init: RequestInit & { headers: Record<string, string> },
    path = '/v1/categories'
  ): Promise<Answer | undefined> {
    const target = nextTarget++ % targets.length
    const startedAt = performance.now()
    try {
      const res = await fetch(`${targets[target] ?? ''}${path}`, {
        ...init,
        headers: { authorization: `Bearer ${apiKey}`, ...init.headers },
        signal: AbortSignal.timeout(15_000)
      })
      const body = await res.text()
      exchanges.push({ target, op, startedAt, endedAt: performance.now(), status: res.status })
      return {
        status: res.status,
        body,
        retryAfter: res.headers.get('retry-after'),
        replayed: res.headers.get('idempotent-replayed') === 'true'
      }
    } catch (err) {
      exchanges.push({ target, op, startedAt, endedAt: performance.now(), status: 0 })
      problems.push(`${op} on ${targets[target] ?? ''}: transport failure ${String((err as Error).cause ?? err)}`)
      return undefined
    }
  }

  /** A 503 (or a 409 for a keyed create) must be the contract's Error body with Retry-After. */
  function refusalIsWellFormed (op: string, answer: Answer): boolean {
    const code = answer.status === 503 ? 'SERVICE_UNAVAILABLE' : 'IDEMPOTENCY_KEY_IN_USE'
    try {
      const body = JSON.parse(answer.body) as Record<string, unknown>
      if (
        body.code === code &&
        body.status === answer.status &&
        typeof body.message === 'string' &&
        Object.keys(body).length === 3 &&
        /^\d+$/.test(answer.retryAfter ?? '')
      ) {
        return true
      }
    } catch {}
    problems.push(`${op} answered ${answer.status} without the Error body or Retry-After: ${answer.body.slice(0, 200)}`)
    return false
  }

  function acknowledge (body: string, name: string): void {
    const category = JSON.parse(body) as { id: number; name: string }
    if (category.name !== name) problems.push(`create of ${name} answered with ${body.slice(0, 200)}`)
    if (!acknowledged.has(category.id)) ackTimes.push([performance.now(), category.id])
    acknowledged.set(category.id, category.name)
  }

  async function keyedCreate (name: string, key: string): Promise<void> {
    const init = {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify({ name })
    }
    for (let attempt = 0; ; attempt++) {
      if (performance.now() > state.resolveDeadline) {
        unansweredKeys.push(key)
        return
      }
      const answer = await exchange('create', init)
      if (answer === undefined) return
      if (answer.status === 201) {
        if (attempt > 0) counters.retriedKeys++
        if (answer.replayed) counters.replays++
        acknowledge(answer.body, name)
        return
      }
      if (answer.status !== 503 && answer.status !== 409) {
        problems.push(`keyed create answered ${answer.status}: ${answer.body.slice(0, 200)}`)
        return
      }
      if (!refusalIsWellFormed('keyed create', answer)) return
      await sleep(retryPauseMs)
    }
  }

  async function writer (w: number): Promise<void> {
    for (let seq = 0; !state.stopping; seq++) {
      const name = `${runId}-w${w}-${seq}`
      sentNames.add(name)
      if (Math.random() < (options.keyedShare ?? 0.75)) {
        await keyedCreate(name, `${name}-key`)
      } else {
        const answer = await exchange('create', {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ name })
        })
        if (answer?.status === 201) acknowledge(answer.body, name)
        else if (answer?.status === 503) refusalIsWellFormed('create', answer)
        else if (answer !== undefined) problems.push(`create answered ${answer.status}: ${answer.body.slice(0, 200)}`)
      }
      await sleep(options.writerPauseMs ?? 10)
    }
  }

  async function reader (): Promise<void> {
    while (!state.stopping) {
      const startedAt = performance.now()
      const answer = await exchange('list', { headers: {} })
      if (answer?.status === 200) {
        const ids = (JSON.parse(answer.body) as Array<{ id: number }>).map(c => c.id)
        if (ids.some((id, i) => i > 0 && id <= (ids[i - 1] as number))) {
          problems.push('a list was not in ascending id order')
        }
        const listed = new Set(ids)
        for (const [at, id] of ackTimes) {
          if (at > startedAt - consistencyMs) break
          if (!listed.has(id)) {
            staleListTimes.push(startedAt)
            break
          }
        }
      } else if (answer?.status === 503) {
        refusalIsWellFormed('list', answer)
      } else if (answer !== undefined) {
        problems.push(`list answered ${answer.status}: ${answer.body.slice(0, 200)}`)
      }
      await sleep(options.readerPauseMs ?? 50)
    }
  }

  const running = [
    ...Array.from({ length: options.writers ?? 6 }, async (_, w) => {
      await writer(w)
    }),
    ...Array.from({ length: options.readers ?? 4 }, async () => {
      await reader()
    })
  ]

  const firstCreatedAfter = (at: number): Array<number | undefined> =>
    targets.map((_, target) => {
      const first = exchanges.find(
        e => e.target === target && e.op === 'create' && e.status === 201 && e.startedAt >= at
      )
      return first === undefined ? undefined : Math.round(first.endedAt - at)
    })

  let stopped: Promise<LoadResult> | undefined
  const stop = async (): Promise<LoadResult> => {
    stopped ??= finish()
    return await stopped
  }
  // A test that ended early: stop at once, without retrying unanswered keys.
  t.teardown(async () => {
    if (stopped === undefined) state.resolveDeadline = performance.now()
    await stop()
  })
  return { firstCreatedAfter, acknowledgedCount: () => acknowledged.size, stop }

  async function finish (): Promise<LoadResult> {
    state.stopping = true
    state.resolveDeadline = Math.min(state.resolveDeadline, performance.now() + RESOLVE_LIMIT_MS)
    await Promise.all(running)
    return {
      apiKey,
      exchanges,
      sentNames,
      acknowledged,
      unansweredKeys,
      retriedKeys: counters.retriedKeys,
      replays: counters.replays,
      staleListTimes,
      problems,
      firstCreatedAfter
    }
  }
}

export interface AuditOptions {
  /** The database the final table is read from (after a failover: the new primary). */
  databaseUrl: string
  instances: Instances
  /** The table's rows before the load started (seeded rows no load client sent). */
  before: Array<{ id: number; name: string }>
  /** Stale lists asked for before this time (performance.now()) are counted, not failed: for a topology that cannot be
   * consistent for a while. */
  staleListsAllowedBefore?: number
  /** Stop the instances at the end, each to exit 0 on SIGTERM (default true); false leaves that to the test. */
  stopInstances?: boolean
}

/** What the load did and what the audit found, for the test's output and docs. */
export interface Figures {
  creates: number
  staleLists: number
  acknowledged: number
  retriedKeys: number
  replays: number
  lists: number
  answers: Record<string, number>
  tableRows: number
}

export async function auditLoad (t: Test, result: LoadResult, options: AuditOptions): Promise<Figures> {
  const { instances } = options
  const exited = instances.exited()
  t.same(
    exited.map(i => `${i.name} exited (${i.exit?.code ?? i.exit?.signal ?? ''}): ${instances.logTail(i, 5)}`),
    [],
    'no instance exited'
  )
  t.same(
    result.problems.slice(0, 10),
    [],
    'no 500, no transport failure; every refusal a 503 (or 409) Error body with Retry-After'
  )
  t.equal(result.problems.length, 0, `${result.problems.length} problems`)
  t.same(result.unansweredKeys.slice(0, 10), [], 'every Idempotency-Key got its 201 (none stuck)')
  const allowedBefore = options.staleListsAllowedBefore ?? -Infinity
  const stale = result.staleListTimes.filter(at => at >= allowedBefore)
  if (stale.length < result.staleListTimes.length) {
    t.comment(`${result.staleListTimes.length - stale.length} stale lists in the allowed window`)
  }
  t.equal(stale.length, 0, 'no list missed a create acknowledged 100 ms or more before it was asked for')

  const rows = await tableRows(options.databaseUrl)
  const byId = new Map(rows.map(r => [r.id, r.name]))
  const lost = [...result.acknowledged].filter(([id, name]) => byId.get(id) !== name)
  t.same(
    lost.slice(0, 10),
    [],
    `every one of ${result.acknowledged.size} acknowledged creates is in the table with its name`
  )
  const seeded = new Set(options.before.map(r => r.id))
  const phantoms = rows.filter(r => !seeded.has(r.id) && !result.sentNames.has(r.name))
  t.same(phantoms.slice(0, 10), [], 'no row that no client sent')
  const names = rows.filter(r => !seeded.has(r.id)).map(r => r.name)
  t.equal(new Set(names).size, names.length, 'no create stored twice')

  const table = JSON.stringify(rows.map(r => [r.id, r.name]))
  for (const instance of instances.list) {
    const res = await fetch(`${instance.url}/v1/categories`, {
      headers: { authorization: `Bearer ${result.apiKey}` },
      signal: AbortSignal.timeout(15_000)
    }).then(
      async res => ({ status: res.status, body: await res.text() }),
      (err: Error) => ({ status: 0, body: String(err.cause ?? err) })
    )
    t.equal(res.status, 200, `${instance.name} lists: ${res.status === 200 ? 'ok' : res.body.slice(0, 200)}`)
    const listed =
      res.status === 200
        ? JSON.stringify((JSON.parse(res.body) as Array<{ id: number; name: string }>).map(c => [c.id, c.name]))
        : res.body
    t.ok(listed === table, `${instance.name}'s list equals the table (${rows.length} rows)`)
  }
  if (options.stopInstances !== false) {
    for (const stopped of await instances.stop()) t.equal(stopped.code, 0, `${stopped.name} stopped cleanly on SIGTERM`)
  }

  const answers: Record<string, number> = {}
  for (const e of result.exchanges) answers[`${e.op} ${e.status}`] = (answers[`${e.op} ${e.status}`] ?? 0) + 1
  return {
    creates: result.sentNames.size,
    staleLists: result.staleListTimes.length,
    acknowledged: result.acknowledged.size,
    retriedKeys: result.retriedKeys,
    replays: result.replays,
    lists: result.exchanges.filter(e => e.op === 'list' && e.status === 200).length,
    answers,
    tableRows: rows.length
  }
}
