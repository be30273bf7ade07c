import { Counter, type Registry } from 'prom-client'
import type { Row, Table, Versioned } from '../db/table.js'
import type { ChangeFeed } from './change-feed.js'
import { SEGMENT_IDS, SegmentedList, type ListBody, type Page, type RowJson } from './segmented-list.js'

/** Where a list is read from: a resource's table, whose triggers announce its changes (migrations). */
export type ListSource<T extends Row> = Pick<Table<object, T>, 'name' | 'listJson' | 'getMany' | 'page'>

/** One row as the list's JSON writes it (fast-json-stringify of the item schema). */
export type RowSerializer<T> = (row: T) => string

/**
 * What the triggers announce (migrations): inserted ids alone; `updated:`, the transaction id (the xmin of the rows
 * it wrote) and the ids; `deleted:` and the ids.
 */
const ANNOUNCEMENT = /^(?:updated:([0-9]{1,10}):|(deleted):)?([0-9]{1,19}(?:,[0-9]{1,19})*)$/

interface Announced { kind: 'inserted' | 'updated' | 'deleted', ids: bigint[], version?: string }

/** An own update under way: the versions of its row announced since it began (a deletion as ''). */
interface Watch { announced: Set<string> }

const DELETION = ''

/**
 * A resource's list (segmented-list.ts), kept while the change feed hears, else read from the database. Every change
 * is applied in the order it was announced (the feed's order is the commits' order), each after the ones before it;
 * a read waits for the changes announced before it. A row an announcement names is read again, or removed when
 * deleted; a change it cannot follow (a TRUNCATE, too many ids) drops the list, and the next read builds it again.
 * A generation counter keeps a build or change that a drop overtook from being installed.
 */
export class ListCache<T extends Row> {
  private list: SegmentedList | undefined
  private generation = 0
  private building: { generation: number, promise: Promise<SegmentedList> } | undefined
  /** The changes announced so far, applied one after another. */
  private changes: Promise<void> = Promise.resolve()
  private unapplied = 0 // a read with none to wait for answers without a turn of the microtask queue
  /** This instance's creates under way: a notification can arrive before the create's own answer does. */
  private readonly creates = new Set<Promise<unknown>>()
  private readonly watches = new Map<bigint, Set<Watch>>()
  /** Rows the next queued read of rows will read again. */
  private rereads: { generation: number, ids: Set<bigint> } | undefined
  /** Settles when the last queued read of rows has been applied. */
  private rereadsApplied: Promise<void> = Promise.resolve()
  /** Versions of rows this instance updated and listed, until the update's own notification (its echo) comes. */
  private readonly ownVersions = new Map<bigint, string>()
  private readonly reads = { cache: 0, changed: 0, refresh: 0, database: 0 }
  private readonly rowsChanged = { added: 0, replaced: 0, removed: 0 }
  /** Notifications whose rows the list already had (the echoes of this instance's own creates and updates). */
  private readonly echoes: Counter

  constructor (private readonly source: ListSource<T>, private readonly feed: ChangeFeed,
    private readonly serialize: RowSerializer<T>, registry?: Registry) {
    feed.subscribe(`${source.name}_changed`, {
      notified: payload => { this.notified(payload) },
      invalidate: () => { this.invalidate() },
      // Built before a read asks: a read after the feed (re)connects is as fast as any. A failure waits for a read.
      hearing: () => { this.warm().catch(() => {}) }
    })
    const registers = registry === undefined ? [] : [registry]
    this.echoes = new Counter({
      name: `${source.name}_list_own_echoes_total`,
      help: 'Notifications that announced only rows the cached list already had: this instance\'s own creates ' +
        'and updates, not read again',
      registers
    })
    for (const registry of registers) this.registerMetrics(registry)
  }

  invalidate (): void {
    this.generation++
    this.list = undefined
    this.ownVersions.clear()
  }

  /** The whole list, as sent. */
  async read (): Promise<ListBody> {
    const list = await this.current()
    if (list === undefined) {
      this.reads.database++
      return (await this.snapshot()).body()
    }
    if (list.unchanged) this.reads.cache++
    else this.reads.changed++
    return list.body()
  }

  /** Up to `limit` rows with ids above `after`, from the same list (or the database while the feed cannot vouch). */
  async page (after: bigint, limit: number): Promise<Page> {
    const list = await this.current()
    if (list !== undefined) {
      this.reads.cache++
      return list.page(after, limit)
    }
    this.reads.database++
    const rows = await this.source.page(after, limit + 1)
    const shown = rows.slice(0, limit)
    const body = Buffer.from(`[${shown.map(this.serialize).join(',')}]`)
    return { body, lastId: shown.at(-1)?.id, more: rows.length > limit }
  }

  /** Builds the list now, if the feed hears (a warm start), rather than on the first read. */
  async warm (): Promise<void> {
    if (this.feed.listening && this.list === undefined) await this.build()
  }

  /** Whether a read would be answered without building the list first: it is built, or the feed cannot vouch. */
  get warmed (): boolean {
    if (!this.feed.settled) return false
    return !this.feed.listening || this.list !== undefined
  }

  /** Runs an own create: rows announced meanwhile are looked for among its rows before being read again. */
  async writing<R> (write: Promise<R>): Promise<R> {
    this.creates.add(write)
    return await write.finally(() => this.creates.delete(write))
  }

  /** Rows this instance committed; called before their 201s are sent, so the next read here lists them. */
  created (rows: readonly T[]): void {
    // Added at once (a notification of these rows may be waiting for them: their echo); during a build, after it.
    if (this.list === undefined) this.announce(async () => { this.addNew(rows) })
    else this.addNew(rows)
  }

  /**
   * Runs an own update of row `id`: once it has committed, the next read here lists its row, or a newer version
   * read again when another change of the row was announced meanwhile (only the database knows which is newer).
   */
  async updating<R> (id: bigint, write: Promise<R>, updated: (result: R) => Versioned<T> | undefined): Promise<R> {
    const watch: Watch = { announced: new Set() }
    const watches = this.watches.get(id) ?? new Set()
    watches.add(watch)
    this.watches.set(id, watches)
    let result: R
    try {
      result = await write
    } catch (err) {
      this.updated(id, watch, undefined)
      throw err
    } finally {
      // What is announced from now on is applied after this update's own change: the watch is done. Kept until
      // that change ran, watches of a busy row would pile up, and every announcement of it would visit them all.
      watches.delete(watch)
      if (watches.size === 0) this.watches.delete(id)
    }
    this.updated(id, watch, updated(result))
    return result
  }

  /** Ids this instance deleted: gone from the next read here. */
  deleted (ids: readonly bigint[]): void {
    this.announce(async () => { this.change([], ids) })
  }

  /**
   * An own update ended, after the changes announced before it: its row is listed, unless a version of the row
   * other than its own was announced meanwhile (then the row is read again), or it wrote nothing (then the row is
   * read again only if someone else changed it).
   */
  private updated (id: bigint, watch: Watch, written: Versioned<T> | undefined): void {
    this.announce(async () => {
      const others = [...watch.announced].some(version => version !== written?.version)
      if (others) {
        this.reread([id])
        return
      }
      if (written === undefined) return
      this.change([written.row], [])
      // Its notification is still to come: it will be known by this version, and not read again.
      if (!watch.announced.has(written.version)) this.ownVersions.set(id, written.version)
    })
  }

  private notified (payload: string): void {
    const announced = parseAnnouncement(payload)
    if (announced === undefined) {
      this.invalidate() // '' (a TRUNCATE) or '*' (more ids than a notification holds)
      return
    }
    const watched = new Set<bigint>()
    if (announced.kind !== 'inserted') {
      const version = announced.version ?? DELETION
      for (const id of announced.ids) {
        const watches = this.watches.get(id)
        if (watches === undefined) continue
        watched.add(id)
        for (const watch of watches) watch.announced.add(version)
      }
    }
    this.announce(async generation => { await this.follow(announced, watched, generation) })
  }

  /**
   * Brings the announced rows up to date: deleted ones removed, the others read again (gone: removed), but for
   * the echoes of this instance's own creates and updates, which the list has already, and the rows of own updates
   * that were under way when it was announced (`watched`): each of those reads its row again if it must.
   */
  private async follow ({ kind, ids, version }: Announced, watched: ReadonlySet<bigint>, generation: number):
  Promise<void> {
    if (kind === 'deleted') {
      this.change([], ids)
      return
    }
    let wanted = ids
    if (kind === 'updated') {
      wanted = ids.filter(id => this.ownVersions.get(id) !== version && !watched.has(id))
      for (const id of ids) if (this.ownVersions.get(id) === version) this.ownVersions.delete(id)
      if (wanted.length === 0) {
        this.echoes.inc()
        return
      }
    }
    if (kind === 'inserted') {
      // The rows of this instance's own creates are in the list already, or will be once those creates answer.
      if (this.creates.size > 0 && !ids.every(id => this.has(id))) await Promise.allSettled([...this.creates])
      if (generation !== this.generation) return
      wanted = ids.filter(id => !this.has(id))
      if (wanted.length === 0) {
        this.echoes.inc()
        return
      }
    }
    this.reread(wanted)
  }

  /**
   * Reads rows again, in one read with every row the changes queued before it ask for: one by one, rereads fell
   * behind busy rows' updates, and the queue grew without bound. Read later, a row is newer, never older: every
   * other change applies either a removal or an own update's row, which nothing announced before it has overtaken.
   */
  private reread (ids: readonly bigint[]): void {
    if (this.rereads?.generation !== this.generation) {
      const wanted = { generation: this.generation, ids: new Set<bigint>() }
      this.rereads = wanted
      this.announce(async generation => {
        this.rereads = undefined
        const asked = [...wanted.ids]
        const rows = await this.source.getMany(asked)
        if (generation !== this.generation) return
        const found = new Set(rows.map(row => row.id))
        this.change(rows, asked.filter(id => !found.has(id)))
      })
      this.rereadsApplied = this.changes
    }
    for (const id of ids) this.rereads.ids.add(id)
  }

  private has (id: bigint): boolean {
    return this.list?.has(id) === true
  }

  private addNew (rows: readonly T[]): void {
    const fresh = rows.filter(row => !this.has(row.id))
    if (fresh.length > 0) this.change(fresh, [])
  }

  private change (rows: readonly T[], removed: readonly bigint[]): void {
    const changed = (this.list as SegmentedList).apply(rows.map(row => this.json(row)), removed)
    this.rowsChanged.added += changed.added
    this.rowsChanged.replaced += changed.replaced
    this.rowsChanged.removed += changed.removed
  }

  private json (row: T): RowJson {
    return { id: row.id, json: Buffer.from(this.serialize(row)) }
  }

  /** The list to answer from, after the changes announced before this read; undefined while the feed is deaf. */
  private async current (): Promise<SegmentedList | undefined> {
    if (!this.feed.listening) return undefined
    if (this.list === undefined) await this.build()
    if (this.unapplied > 0) {
      await this.changes
      // The rows those changes asked to read again are read after them.
      await this.rereadsApplied
    }
    // Dropped meanwhile (a change the cache could not follow): the database answers this one.
    return this.list
  }

  /** The list as the table holds it, its body made (each segment was hashed as it came). */
  private async snapshot (): Promise<SegmentedList> {
    const list = new SegmentedList()
    await this.source.listJson(SEGMENT_IDS, segment => { list.append(segment) })
    list.body()
    return list
  }

  /** One build at a time, shared; changes announced while it read are applied after it (none added twice). */
  private async build (): Promise<void> {
    if (this.building?.generation !== this.generation) {
      this.reads.refresh++
      const generation = this.generation
      const promise = this.snapshot().then(list => {
        if (generation === this.generation && this.feed.listening) this.list = list
        return list
      })
      const building = { generation, promise }
      this.building = building
      promise.catch(() => { if (generation === this.generation) this.invalidate() })
        .finally(() => { if (this.building === building) this.building = undefined })
    }
    await this.building.promise
  }

  /** Applies a change after those announced before it (and after the build under way). */
  private announce (change: (generation: number) => Promise<void>): void {
    const building = this.building?.promise
    // Nothing cached: the next build reads it.
    if (this.list === undefined && building === undefined) return
    const generation = this.generation
    this.unapplied++
    this.changes = this.changes.then(async () => {
      await building
      if (generation === this.generation && this.list !== undefined) await change(generation)
    }).catch(() => {
      // The database could not say what changed: nobody may be served a list without it.
      if (generation === this.generation) this.invalidate()
    }).finally(() => {
      this.unapplied--
    })
  }

  private registerMetrics (registry: Registry): void {
    const prefix = this.source.name
    countsOf(registry, `${prefix}_list_reads_total`, 'List reads (whole or a page) by source: cache (the list in ' +
      'memory), changed (the same, after changes it applied), database (the change feed cannot vouch for the ' +
      'cache); refresh counts the whole list\'s builds from the database (at start, after a drop), whatever started ' +
      'them', 'source', this.reads)
    countsOf(registry, `${prefix}_list_rows_changed_total`, 'Rows the cached list added, replaced or removed as ' +
      'creates, updates and deletes were announced', 'change', this.rowsChanged)
  }
}

function parseAnnouncement (payload: string): Announced | undefined {
  const match = ANNOUNCEMENT.exec(payload)
  if (match === null) return undefined
  const [, version, deleted, list] = match
  const ids = (list as string).split(',').map(BigInt)
  if (version !== undefined) return { kind: 'updated', ids, version }
  return { kind: deleted === undefined ? 'inserted' : 'deleted', ids }
}

/** A counter of plain counts by one label, read at scrape time: nothing on the requests' path. */
function countsOf (registry: Registry, name: string, help: string, label: string, counts: Record<string, number>):
void {
  // eslint-disable-next-line no-new
  new Counter({
    name,
    help,
    labelNames: [label],
    registers: [registry],
    collect () {
      this.reset()
      for (const [value, count] of Object.entries(counts)) this.labels(value).inc(count)
    }
  })
}
