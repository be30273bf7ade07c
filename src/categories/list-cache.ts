import { createHash } from 'node:crypto'
import { Counter, Gauge, type Registry } from 'prom-client'
import { CategoryChangeFeed, type ChangeFeedOptions } from './change-feed.js'
import type { CategoryRepository } from './repository.js'
import type { Category } from './schemas.js'

/** The list as sent on the wire, and its strong ETag. */
export interface SerializedList {
  /** UTF-8 bytes, encoded once: every response writes the same Buffer instead of re-encoding a string. */
  body: Buffer
  etag: string
}

export type ListSerializer = (list: Category[]) => string

export function etagOf (body: Buffer): string {
  return `"${createHash('sha1').update(body).digest('base64url')}"`
}

/** If-None-Match (RFC 9110 13.1.2): `*`, or a list of tags compared weakly. */
export function ifNoneMatchHits (header: string | undefined, etag: string): boolean {
  if (header === undefined) return false
  if (header === etag) return true
  if (header.trim() === '*') return true
  for (const part of header.split(',')) {
    const tag = part.trim()
    if ((tag.startsWith('W/') ? tag.slice(2) : tag) === etag) return true
  }
  return false
}

type ReadSource = 'cache' | 'refresh' | 'database'

/**
 * The serialized category list, kept in memory while the change feed is
 * listening and invalidated by its notifications (and by this instance's own
 * creates, before they answer). While the feed is down every read goes to the
 * database. A generation counter stops a refresh that started before an
 * invalidation from installing its (possibly stale) result; concurrent readers
 * share one refresh instead of all querying at once.
 */
export class CategoryListCache {
  private generation = 0
  private entry: SerializedList | undefined
  private refreshing: { generation: number, promise: Promise<SerializedList> } | undefined
  private readonly feed: CategoryChangeFeed
  private readonly reads: Partial<Record<ReadSource, { inc: () => void }>> = {}

  constructor (
    private readonly repository: Pick<CategoryRepository, 'list'>,
    options: Omit<ChangeFeedOptions, 'onChange'> & { registry?: Registry }
  ) {
    this.feed = new CategoryChangeFeed({ ...options, onChange: () => { this.invalidate() } })
    if (options.registry !== undefined) {
      const registers = [options.registry]
      const reads = new Counter({ name: 'categories_list_reads_total', help: 'Category list reads by source: cache, refresh (one query shared by waiting readers) or database (change feed down)', labelNames: ['source'], registers })
      // Children bound once: the hot path then skips label hashing.
      for (const source of ['cache', 'refresh', 'database'] as const) this.reads[source] = reads.labels(source)
      const feed = this.feed
      // eslint-disable-next-line no-new
      new Gauge({ name: 'categories_change_feed_listening', help: '1 while the change feed listens and the list cache may be used', registers, collect () { this.set(feed.listening ? 1 : 0) } })
      // eslint-disable-next-line no-new
      new Gauge({ name: 'categories_change_feed_drops', help: 'Times the change feed connection was lost or could not be made', registers, collect () { this.set(feed.drops) } })
    }
  }

  start (): void { this.feed.start() }

  async close (): Promise<void> { await this.feed.close() }

  /** True while the cache may be used (the change feed is up). */
  get listening (): boolean { return this.feed.listening }

  invalidate (): void {
    this.generation++
    this.entry = undefined
  }

  async read (serialize: ListSerializer): Promise<SerializedList> {
    if (!this.feed.listening) {
      this.count('database')
      return await this.load(serialize)
    }
    if (this.entry !== undefined) {
      this.count('cache')
      return this.entry
    }
    this.count('refresh')
    if (this.refreshing?.generation === this.generation) return await this.refreshing.promise
    const generation = this.generation
    const refreshing = { generation, promise: this.load(serialize) }
    this.refreshing = refreshing
    try {
      const list = await refreshing.promise
      // Only a result that no invalidation overtook may be kept.
      if (generation === this.generation && this.feed.listening) this.entry = list
      return list
    } finally {
      if (this.refreshing === refreshing) this.refreshing = undefined
    }
  }

  private async load (serialize: ListSerializer): Promise<SerializedList> {
    const body = Buffer.from(serialize(await this.repository.list()), 'utf8')
    return { body, etag: etagOf(body) }
  }

  private count (source: ReadSource): void { this.reads[source]?.inc() }
}
