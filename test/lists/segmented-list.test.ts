import fc from 'fast-check'
import t from 'tap'
import { SEGMENT_IDS, SegmentedList, type ListBody } from '../../src/machinery/segmented-list.js'

/*
 * The segmented list alone (machinery/segmented-list.ts), against a model: a map of ids to their JSON, serialized
 * afresh after every step. Replay: FC_SEED=<seed> npm test -- test/lists/segmented-list.test.ts.
 */
const seed =
  process.env.FC_SEED !== undefined && process.env.FC_SEED !== ''
    ? Number(process.env.FC_SEED)
    : Math.floor(Math.random() * 2 ** 31)
t.comment(`fast-check seed ${seed}`)

const json = (id: bigint, text: string): Buffer => Buffer.from(`{"id":${id},"name":${JSON.stringify(text)}}`)
const bodyText = (list: ListBody): string =>
  (Buffer.isBuffer(list.body) ? list.body : Buffer.concat(list.body)).toString()

/** A list built as a build makes it: one segment per key, in key order, from rows sorted by id. */
function built (model: Map<bigint, Buffer>): SegmentedList {
  const list = new SegmentedList()
  const ids = [...model.keys()].sort((a, b) => (a < b ? -1 : 1))
  const size = BigInt(SEGMENT_IDS)
  for (let from = 0; from < ids.length;) {
    const key = (ids[from] as bigint) / size
    let to = from
    while (to < ids.length && (ids[to] as bigint) / size === key) to++
    const rows = ids.slice(from, to).map(id => model.get(id) as Buffer)
    const ends: number[] = []
    let length = 0
    for (const row of rows) {
      length += row.length
      ends.push(length)
      length++
    }
    list.append({
      key,
      ids: BigInt64Array.from(ids.slice(from, to)),
      ends: Uint32Array.from(ends),
      bytes: Buffer.from(rows.join(','))
    })
    from = to
  }
  return list
}

const expected = (model: Map<bigint, Buffer>, after = 0n, limit = Infinity): string =>
  `[${[...model.entries()]
    .filter(([id]) => id > after)
    .sort(([a], [b]) => (a < b ? -1 : 1))
    .slice(0, limit)
    .map(([, row]) => row.toString())
    .join(',')}]`

// Ids bunched in a few segments (so that changes land beside each other), and some anywhere in int64.
const id = fc.oneof(fc.bigInt(1n, 3n * BigInt(SEGMENT_IDS)), fc.bigInt(1n, 2n ** 63n - 1n))
const step = fc.record({
  puts: fc.array(fc.tuple(id, fc.string({ maxLength: 12 })), { maxLength: 20 }),
  removes: fc.array(id, { maxLength: 10 }),
  removeKnown: fc.nat({ max: 5 })
})

t.test('any sequence of puts and removes gives the bytes, tag, pages and membership of a fresh build', async t => {
  fc.assert(
    fc.property(
      fc.array(step, { minLength: 1, maxLength: 15 }),
      fc.nat(),
      fc.integer({ min: 1, max: 50 }),
      (steps, pick, limit) => {
        const model = new Map<bigint, Buffer>()
        const list = new SegmentedList()
        for (const { puts, removes, removeKnown } of steps) {
          // Removals of rows the list holds too, not only of ids it never had.
          const known = [...model.keys()].slice(0, removeKnown)
          const rows = puts.map(([rowId, text]) => ({ id: rowId, json: json(rowId, text) }))
          list.apply(rows, [...removes, ...known])
          for (const row of rows) model.set(row.id, row.json)
          for (const gone of [...removes, ...known]) model.delete(gone)
          // Before a body is made the changes wait, merged into no segment yet: membership already holds.
          for (const touched of [...rows.map(row => row.id), ...removes, ...known]) {
            if (list.has(touched) !== model.has(touched)) throw new Error(`before a read, has(${touched}) is wrong`)
          }
          const fresh = built(model).body()
          const body = list.body()
          if (bodyText(body) !== expected(model)) throw new Error(`body ${bodyText(body)} is not ${expected(model)}`)
          if (body.etag !== fresh.etag) throw new Error("the tag is not a fresh build's")
          if (body.length !== Buffer.byteLength(expected(model))) throw new Error('the length is wrong')
        }
        const ids = [...model.keys()]
        for (const probe of [...ids, ...ids.map(known => known + 1n), 1n]) {
          if (list.has(probe) !== model.has(probe)) throw new Error(`has(${probe}) is ${list.has(probe)}`)
        }
        const sorted = ids.sort((a, b) => (a < b ? -1 : 1))
        const after = sorted.length === 0 ? 0n : (sorted[pick % sorted.length] as bigint)
        const page = list.page(after, limit)
        if (page.body.toString() !== expected(model, after, limit)) {
          throw new Error(`page after ${after}: ${page.body.toString()}`)
        }
        const rest = sorted.filter(next => next > after)
        if (page.more !== (rest.length > limit)) {
          throw new Error(`more is ${page.more} with ${rest.length} rows after ${after}`)
        }
        if (page.lastId !== rest.slice(0, limit).at(-1)) throw new Error(`last id ${page.lastId}`)
      }
    ),
    { seed, numRuns: 300 }
  )
  t.pass('every run matched the model')
})

t.test(
  'a body is made once per version; a put of the same bytes or removal of an absent id changes nothing',
  async t => {
    const list = new SegmentedList()
    list.apply([
      { id: 1n, json: json(1n, 'a') },
      { id: 5000n, json: json(5000n, 'b') }
    ])
    const first = list.body()
    t.equal(list.body(), first, 'the same object while nothing changed')
    t.ok(list.unchanged)
    // The echo of an own write: the same row again, an id already gone.
    t.same(list.apply([{ id: 1n, json: json(1n, 'a') }], [2n]), { added: 0, replaced: 0, removed: 0 })
    t.ok(list.unchanged, 'no new version')
    t.equal(list.body(), first)
    t.same(
      list.apply(
        [
          { id: 1n, json: json(1n, 'A') },
          { id: 2n, json: json(2n, 'b') }
        ],
        [5000n]
      ),
      { added: 1, replaced: 1, removed: 1 }
    )
    t.notOk(list.unchanged, 'a change makes a new version')
    t.not(list.body().etag, first.etag)
    t.equal(bodyText(list.body()), `[${json(1n, 'A').toString()},${json(2n, 'b').toString()}]`)
    list.apply([], [1n, 2n])
    t.equal(bodyText(list.body()), '[]', 'empty when every row is removed')
    t.equal(list.page(0n, 10).body.toString(), '[]')
  }
)

t.test('a long list stays in parts (none copied into one buffer); a short one is one buffer', async t => {
  const list = new SegmentedList()
  const rows = Array.from({ length: 3 * SEGMENT_IDS }, (_, i) => ({
    id: BigInt(i + 1),
    json: json(BigInt(i + 1), 'x'.repeat(120))
  }))
  list.apply(rows)
  const long = list.body()
  t.notOk(Buffer.isBuffer(long.body), 'parts')
  t.equal(
    (long.body as Buffer[]).length,
    2 * 4 + 1,
    'an opening bracket, four segments with commas between, a closing one'
  )
  list.apply(
    [],
    rows.slice(SEGMENT_IDS).map(row => row.id)
  )
  t.ok(Buffer.isBuffer(list.body().body), 'one buffer')
})
