import { Registry } from 'prom-client'
import t from 'tap'
import { ChangeFeed, notificationKind, PROBE_CHANNEL, PROBE_PREFIX } from '../../src/machinery/change-feed.js'
import { GroupCommit } from '../../src/machinery/group-commit.js'
import { decide, digestOf, IdempotencyKeyReusedError, type RecordRow } from '../../src/machinery/idempotency.js'
import { metric } from '../helpers/app.js'

/*
 * The machinery's decisions without a database (src/machinery/): the batcher's
 * batches and failures, which notifications the feed takes for changes, and what
 * an idempotency record says. Their behaviour against PostgreSQL is in list-cache,
 * group-commit and idempotency.test.ts.
 */

interface Item {
  id: bigint
  name: string
}

/** An inserter whose batches the test settles by hand. */
function heldInserter (): {
  batches: Array<{ inputs: string[]; commit: () => void; fail: (err: Error) => void }>
  write: (inputs: string[]) => Promise<Item[]>
} {
  const batches: Array<{ inputs: string[]; commit: () => void; fail: (err: Error) => void }> = []
  let nextId = 1n
  return {
    batches,
    write: async inputs =>
      await new Promise<Item[]>((resolve, reject) => {
        batches.push({
          inputs,
          commit: () => {
            resolve(inputs.map(name => ({ id: nextId++, name })))
          },
          fail: reject
        })
      })
  }
}
const turn = async (): Promise<void> => {
  await new Promise(resolve => setImmediate(resolve))
}

t.test('batcher: a lone create goes at once; creates that arrive meanwhile share the next batch, in order', async t => {
  const inserter = heldInserter()
  const told: Array<string | Item[]> = []
  const registry = new Registry()
  const batcher = new GroupCommit<string, Item>({
    ...inserter,
    metrics: { registry, name: 'widgets_insert' },
    maxRows: 3,
    observer: {
      committed: rows => {
        told.push(rows)
      },
      failed: () => {
        told.push('failed')
      }
    }
  })
  const first = batcher.write('a')
  await turn()
  t.same(
    inserter.batches.map(b => b.inputs),
    [['a']],
    'the lone create is a batch of its own'
  )
  const rest = ['b', 'c', 'd', 'e'].map(async name => await batcher.write(name))
  await turn()
  t.equal(inserter.batches.length, 1, 'nothing else goes while a batch is in flight')
  inserter.batches[0]?.commit()
  t.same(await first, { id: 1n, name: 'a' })
  await turn()
  t.same(
    inserter.batches.map(b => b.inputs),
    [['a'], ['b', 'c', 'd']],
    'the next batch takes up to maxRows, in arrival order'
  )
  inserter.batches[1]?.commit()
  await turn()
  inserter.batches[2]?.commit()
  t.same(
    (await Promise.all(rest)).map(r => r.name),
    ['b', 'c', 'd', 'e'],
    'each create gets its own row'
  )
  t.same(
    told.map(x => (typeof x === 'string' ? x : x.map(r => r.name))),
    [['a'], ['b', 'c', 'd'], ['e']],
    'the observer heard of every batch'
  )
  const histogram = (await registry.getSingleMetric('widgets_insert_batch_rows')?.get())?.values ?? []
  t.equal(
    histogram.find(v => (v as { metricName?: string }).metricName === 'widgets_insert_batch_rows_count')?.value,
    3,
    "three batches, under the resource's prefix"
  )
})

t.test('batcher: with maxInFlight, that many batches run at once from one queue', async t => {
  const inserter = heldInserter()
  const batcher = new GroupCommit<string, Item>({ ...inserter, maxRows: 1, maxInFlight: 3 })
  const created = ['a', 'b', 'c', 'd', 'e'].map(async name => await batcher.write(name))
  await turn()
  t.same(
    inserter.batches.map(b => b.inputs),
    [['a'], ['b'], ['c']],
    'three batches of one row go at once'
  )
  inserter.batches[1]?.commit()
  await turn()
  t.same(
    inserter.batches.map(b => b.inputs),
    [['a'], ['b'], ['c'], ['d']],
    'a finished batch makes room for the next'
  )
  for (const batch of inserter.batches) batch.commit()
  await turn()
  inserter.batches[4]?.commit()
  t.same(
    (await Promise.all(created)).map(r => r.name),
    ['a', 'b', 'c', 'd', 'e']
  )
})

t.test(
  'batcher: a failed batch fails each of its creates, tells the observer, and the next batch still goes',
  async t => {
    const inserter = heldInserter()
    const told: string[] = []
    const registry = new Registry()
    const batcher = new GroupCommit<string, Item>({
      ...inserter,
      metrics: { registry, name: 'widgets_insert' },
      observer: {
        committed: () => {
          told.push('created')
        },
        failed: () => {
          told.push('failed')
        }
      }
    })
    const doomed = [batcher.write('x'), batcher.write('y')]
    await turn()
    inserter.batches[0]?.fail(new Error('lost'))
    for (const create of doomed) await t.rejects(create, /lost/)
    t.same(told, ['failed'], 'the outcome is unknown: the observer drops what it holds')
    t.equal(await metric(registry, 'widgets_insert_batch_failures_total'), 1)
    const after = batcher.write('z')
    await turn()
    inserter.batches[1]?.commit()
    t.same(await after, { id: 1n, name: 'z' })
  }
)

t.test('batcher: writes of one key never share a batch; the second waits for the next, in order', async t => {
  const inserter = heldInserter()
  const batcher = new GroupCommit<string, Item>({ ...inserter, keyOf: name => name.split(':')[0] })
  const written = ['x:1', 'y:1', 'x:2', 'z:1', 'x:3'].map(async name => await batcher.write(name))
  await turn()
  t.same(
    inserter.batches.map(b => b.inputs),
    [['x:1', 'y:1', 'z:1']],
    'one write of x per batch'
  )
  inserter.batches[0]?.commit()
  await turn()
  inserter.batches[1]?.commit()
  await turn()
  inserter.batches[2]?.commit()
  t.same(
    inserter.batches.map(b => b.inputs),
    [['x:1', 'y:1', 'z:1'], ['x:2'], ['x:3']]
  )
  t.same(
    (await Promise.all(written)).map(r => r.name),
    ['x:1', 'y:1', 'x:2', 'z:1', 'x:3']
  )
})

t.test('feed: which notifications are changes', async t => {
  const state = { awaitedProbe: `${PROBE_PREFIX}abc/2`, subscribed: (c: string) => c === 'widgets_changed' }
  t.equal(notificationKind(PROBE_CHANNEL, `${PROBE_PREFIX}abc/2`, state), 'awaited-probe')
  t.equal(
    notificationKind(PROBE_CHANNEL, `${PROBE_PREFIX}abc/1`, state),
    'other-probe',
    'a late echo of an earlier probe'
  )
  t.equal(notificationKind(PROBE_CHANNEL, `${PROBE_PREFIX}other/7`, state), 'other-probe', "another instance's probe")
  t.equal(
    notificationKind('widgets_changed', `${PROBE_PREFIX}old/1`, state),
    'other-probe',
    'a probe on a change channel is no change'
  )
  t.equal(notificationKind('widgets_changed', '12,13', state), 'change', 'inserted ids')
  t.equal(notificationKind('widgets_changed', 'deleted:12', state), 'change', 'deleted ids')
  t.equal(notificationKind('widgets_changed', '', state), 'change', 'any other change')
  t.equal(notificationKind('gadgets_changed', '12', state), 'unsubscribed')
})

const ignored = { notified () {}, invalidate () {} }

t.test('feed: channels are subscribed before it starts, once each, with plain names', async t => {
  const feed = new ChangeFeed({
    connectionString: 'postgres://nobody@127.0.0.1:1/none',
    notify: async () => {},
    log: { warn () {}, info () {} }
  })
  feed.subscribe('widgets_changed', ignored)
  t.throws(() => feed.subscribe('widgets_changed', ignored), /already has a subscriber/)
  for (const name of ['Widgets', 'widgets; DROP TABLE x', PROBE_CHANNEL, '']) {
    t.throws(() => feed.subscribe(name, ignored), /not a channel name/, JSON.stringify(name))
  }
  feed.start()
  t.teardown(async () => {
    await feed.close()
  })
  t.throws(() => feed.subscribe('gadgets_changed', ignored), /before it starts/)
})

t.test('idempotency: what a record says', async t => {
  const hash = digestOf(['a', null])
  const done: RecordRow = {
    operation: 'createThing',
    request_hash: hash,
    response_status: 201,
    response_body: '{"id":1}',
    location: '/v1/x/1',
    expired: false
  }
  const decideFor = (record: RecordRow | undefined, body: Buffer): ReturnType<typeof decide> =>
    decide(record, 'createThing', body)
  t.equal(decideFor(undefined, hash), undefined, 'no record: do the work')
  t.same(decideFor(done, hash), { status: 201, body: '{"id":1}', location: '/v1/x/1' }, 'replay the remembered answer')
  t.equal(decideFor({ ...done, expired: true }, digestOf(['b', null])), undefined, 'an expired record binds nothing')
  t.throws(() => decideFor(done, digestOf(['b', null])), IdempotencyKeyReusedError, 'another body')
  t.throws(
    () => decide(done, 'createOther', hash),
    IdempotencyKeyReusedError,
    'another operation, even with the same body'
  )
  t.equal(
    decide({ ...done, expired: true }, 'createOther', hash),
    undefined,
    'an expired record of another operation binds nothing'
  )
  t.not(
    digestOf(['a', 'b']).toString('hex'),
    digestOf(['ab', null]).toString('hex'),
    'parts cannot run into each other'
  )
})
