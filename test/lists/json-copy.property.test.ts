import fc from 'fast-check'
import fastJson from 'fast-json-stringify'
import pg from 'pg'
import t from 'tap'
import { Type } from 'typebox'
import { NewCategorySchema, CategorySchema } from '../../src/categories/schemas.js'
import { Database } from '../../src/db/database.js'
import type { JsonSegment } from '../../src/db/json-copy.js'
import { Table, columnsOf, type Row } from '../../src/db/table.js'
import { withId } from '../../src/http/resource.js'
import { ref } from '../../src/http/schemas.js'
import { AUTH, testApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

/*
 * The list as the cache builds it from COPY's binary rows (db/json-copy.ts) is byte for byte what the route's
 * compiled serializer writes for the same rows, read as objects. Replay: FC_SEED=<seed> npm test -- <this file>.
 */
const seed =
  process.env.FC_SEED !== undefined && process.env.FC_SEED !== ''
    ? Number(process.env.FC_SEED)
    : Math.floor(Math.random() * 2 ** 31)
t.comment(`fast-check seed ${seed}`)

// Every column type columnsOf knows, each member optional.
const NewGadgetSchema = Type.Object(
  {
    name: Type.String(),
    size: Type.Optional(Type.Integer()),
    weight: Type.Optional(Type.Number()),
    ok: Type.Optional(Type.Boolean())
  },
  { $id: 'NewGadget', additionalProperties: false }
)
const GadgetSchema = withId(NewGadgetSchema, 'Gadget')

const db = await testDatabase(t)
let served: unknown[] = []
const { app } = await testApp(
  t,
  db.url,
  {},
  {
    register: async app => {
      app.addSchema(GadgetSchema)
      // The list route's response schema, for rows this test hands it.
      for (const [path, item] of [
        ['categories', CategorySchema],
        ['gadgets', GadgetSchema]
      ] as const) {
        app.get(`/test/${path}`, { schema: { response: { 200: Type.Array(ref(item)) } } }, async () => served)
      }
    }
  }
)
const admin = new pg.Client({ connectionString: db.url })
await admin.connect()
t.teardown(async () => {
  await admin.end()
})
await admin.query(
  'CREATE TABLE gadgets (id bigint PRIMARY KEY, name text NOT NULL, size bigint, weight double precision, ok boolean)'
)
const database = new Database({
  connectionString: db.url,
  applicationName: 'petstore/json-copy-test',
  max: 2,
  maxWaiting: 10,
  connectionTimeoutMs: 5000,
  statementTimeoutMs: 10000,
  log: () => {}
})
t.teardown(async () => {
  await database.end()
})
const categories = new Table(database, 'categories', columnsOf(NewCategorySchema))
const gadgets = new Table(database, 'gadgets', columnsOf(NewGadgetSchema))

const rowSerializers = { categories: fastJson(CategorySchema as object), gadgets: fastJson(GadgetSchema as object) }

/**
 * What the route's serializer writes for the table's rows, read as the row path reads them; the list cache's own
 * serializer of one row (a changed row's bytes) writes the same.
 */
async function serialized (table: Table<object, Row>, path: 'categories' | 'gadgets'): Promise<string> {
  const { rows } = await database.query<{ id: bigint }>(`SELECT id FROM ${table.name}`)
  served = await table.getMany(rows.map(row => row.id))
  const res = await app.inject({ method: 'GET', url: `/test/${path}`, headers: AUTH })
  if (res.statusCode !== 200) throw new Error(`the serializer's route answered ${res.statusCode}: ${res.body}`)
  const byRow = `[${served.map(row => rowSerializers[path](row)).join(',')}]`
  if (byRow !== res.body) throw new Error(`one row at a time: ${byRow}, the route: ${res.body}`)
  return res.body
}

/** The list from COPY, a few rows per statement (so that rows of one segment come in several), checked segment by
 * segment. */
async function copied (table: Table<object, Row>, copyRows: number): Promise<string> {
  const segments: JsonSegment[] = []
  await table.listJson(
    1024,
    segment => {
      segments.push(segment)
    },
    copyRows
  )
  for (const [i, { key, ids, ends, bytes }] of segments.entries()) {
    if (i > 0 && key <= (segments[i - 1] as JsonSegment).key) throw new Error('segments out of order')
    if (ids.some(id => id / 1024n !== key)) throw new Error(`segment ${key} holds another key's id`)
    // Each row's object, cut out by its end and the one before it, is that row.
    ids.forEach((id, j) => {
      const start = j === 0 ? 0 : (ends[j - 1] as number) + 1
      const row = bytes.subarray(start, ends[j]).toString()
      if (!row.startsWith(`{"id":${id}`) || !row.endsWith('}')) throw new Error(`segment ${key}: row ${j} is ${row}`)
      if (bytes[ends[j] as number] !== (j === ids.length - 1 ? undefined : 0x2c)) {
        throw new Error(`segment ${key}: no comma after row ${j}`)
      }
    })
  }
  return `[${segments.map(segment => segment.bytes.toString()).join(',')}]`
}

const specials = [
  '"',
  '\\',
  '/',
  '\u007f',
  '\u0085',
  '\u009f',
  '\u2028',
  '\u2029',
  '\u00e9',
  '\ufeff',
  '\uffff',
  '\u{1f600}',
  '\u{10ffff}',
  ...Array.from({ length: 31 }, (_, i) => String.fromCharCode(i + 1)),
  ...Array.from({ length: 33 }, (_, i) => String.fromCharCode(0x7f + i))
]
const char = fc.oneof(
  fc.constantFrom(...specials),
  fc.string({ unit: 'binary', minLength: 1, maxLength: 1 }).filter(c => c !== '\u0000')
)
/** Text of `min` to `max` code points (categories/schemas.ts's limits), the longest as often as any. */
const text = (min: number, max: number): fc.Arbitrary<string> =>
  fc.oneof(
    fc.string({ unit: char, minLength: min, maxLength: max }),
    fc.string({ unit: char, minLength: max, maxLength: max })
  )
const ids = fc.uniqueArray(fc.oneof(fc.bigInt(1n, 3000n), fc.bigInt(1n, 2n ** 63n - 1n)), { maxLength: 12 })

t.test(
  'categories: every control character, quotes, backslashes, non-ASCII, astral, longest, absent descriptions',
  async t => {
    const rows = ids.chain(list =>
      fc.tuple(
        fc.constant(list),
        fc.array(text(1, 255), { minLength: list.length, maxLength: list.length }),
        fc.array(fc.option(text(0, 2000), { nil: null }), { minLength: list.length, maxLength: list.length })
      )
    )
    await fc.assert(
      fc.asyncProperty(rows, fc.integer({ min: 1, max: 5 }), async ([list, names, descriptions], copyRows) => {
        await admin.query('TRUNCATE categories')
        await admin.query(
          'INSERT INTO categories (id, name, description) SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[])',
          [list.map(String), names, descriptions]
        )
        const expected = await serialized(categories, 'categories')
        t.equal(await copied(categories, copyRows), expected)
      }),
      { seed, numRuns: 40 }
    )
  }
)

t.test(
  'integer, number and boolean columns: int64 limits, -0, infinities, tiny and huge doubles, absent members',
  async t => {
    const gadget = fc.record({
      name: text(1, 20),
      size: fc.option(fc.bigInt(-(2n ** 63n), 2n ** 63n - 1n), { nil: null }),
      weight: fc.option(fc.double({ noNaN: true }), { nil: null }),
      ok: fc.option(fc.boolean(), { nil: null })
    })
    const rows = ids.chain(list =>
      fc.tuple(fc.constant(list), fc.array(gadget, { minLength: list.length, maxLength: list.length }))
    )
    await fc.assert(
      fc.asyncProperty(rows, fc.integer({ min: 1, max: 5 }), async ([list, values], copyRows) => {
        await admin.query('TRUNCATE gadgets')
        await admin.query(
          `INSERT INTO gadgets (id, name, size, weight, ok)
      SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::double precision[], $5::boolean[])`,
          [
            list.map(String),
            values.map(v => v.name),
            values.map(v => v.size?.toString() ?? null),
            values.map(v => v.weight),
            values.map(v => v.ok)
          ]
        )
        const expected = await serialized(gadgets, 'gadgets')
        t.equal(await copied(gadgets, copyRows), expected)
      }),
      { seed, numRuns: 40 }
    )
  }
)

t.test("the service serves those bytes: a list built from COPY, over many chunks, is the serializer's", async t => {
  await admin.query('TRUNCATE categories')
  await admin.query(`INSERT INTO categories (name, description)
    SELECT 'n "' || i || chr(1) || chr(8232) || '\\', CASE WHEN i % 2 = 0 THEN chr(127) || i END
    FROM generate_series(1, 20000) AS i`)
  const expected = await serialized(categories, 'categories')
  let body = ''
  for (let tries = 0; tries < 100 && body !== expected; tries++) {
    body = (await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })).body
    if (body !== expected) await new Promise(resolve => setTimeout(resolve, 50))
  }
  t.equal(body, expected)
})
