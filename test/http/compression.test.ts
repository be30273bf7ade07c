import http from 'node:http'
import { brotliDecompressSync, gunzipSync } from 'node:zlib'
import pg from 'pg'
import t from 'tap'
import { negotiateEncoding } from '../../src/http/content-coding.js'
import { AUTH, json, listeningApp, metric, until } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { expectedListBody } from '../helpers/list-body.js'
import { listTag } from '../helpers/list-tag.js'

const db = await testDatabase(t)
const { app, port } = await listeningApp(t, db.url)
const admin = new pg.Client({ connectionString: db.url })
await admin.connect()
t.teardown(async () => {
  await admin.end()
})

const expectedBody = async (): Promise<string> => await expectedListBody(admin)

interface Got {
  status: number
  headers: http.IncomingHttpHeaders
  raw: Buffer
}

/** A GET of the list over a real socket, the body as it came on the wire (nothing decoded). */
async function get (headers: Record<string, string> = {}): Promise<Got> {
  return await new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path: '/v1/categories', headers: { ...AUTH, ...headers } }, res => {
        const chunks: Buffer[] = []
        res.on('data', (chunk: Buffer) => chunks.push(chunk))
        res.on('end', () => {
          resolve({ status: res.statusCode ?? 0, headers: res.headers, raw: Buffer.concat(chunks) })
        })
        res.on('error', reject)
      })
      .on('error', reject)
  })
}

const decoded = (got: Got): string => {
  const coding = got.headers['content-encoding']
  const bytes = coding === 'gzip' ? gunzipSync(got.raw) : coding === 'br' ? brotliDecompressSync(got.raw) : got.raw
  return bytes.toString('utf8')
}
const compressions = async (encoding: string): Promise<number> =>
  await metric(app, 'categories_list_compressions_total', { encoding })

async function create (name: string, description?: string): Promise<void> {
  const res = await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name, description }) })
  if (res.statusCode !== 201) throw new Error(`create answered ${res.statusCode}: ${res.body}`)
}

t.test('Accept-Encoding is read by q-value (RFC 9110 12.5.3)', async t => {
  const cases: Array<[string | undefined, string | undefined]> = [
    [undefined, undefined],
    ['', undefined],
    ['identity', undefined],
    ['gzip', 'gzip'],
    ['GZip', 'gzip'],
    ['x-gzip', 'gzip'],
    ['br', 'br'],
    ['gzip, deflate, br, zstd', 'br'],
    ['gzip;q=1, br;q=0.5', 'gzip'],
    ['br;q=0.8, gzip;q=0.9', 'gzip'],
    ['gzip;q=0', undefined],
    ['gzip;q=0, br;q=0', undefined],
    ['gzip;q=0.000', undefined],
    ['gzip;q=0, *', 'br'],
    ['br;q=0, *', 'gzip'],
    ['*', 'br'],
    ['*;q=0', undefined],
    ['deflate', undefined],
    ['identity;q=1, gzip;q=0.5', undefined],
    ['identity;q=0, gzip;q=0.5', 'gzip'],
    ['gzip;q=2', undefined],
    ['gzip;q=abc, br;q=0.1', 'br'],
    ['gzip ; q=0.5', 'gzip']
  ]
  for (const [header, coding] of cases) {
    t.equal(negotiateEncoding(header), coding, `${String(header)} -> ${String(coding)}`)
  }
})

t.test('a list under 1 KiB is sent as it is, with Vary', async t => {
  const got = await get({ 'accept-encoding': 'gzip, br' })
  t.equal(got.status, 200)
  t.equal(got.raw.toString(), '[]')
  t.equal(got.headers['content-encoding'], undefined)
  t.equal(got.headers.vary, 'Accept-Encoding')
  t.equal(got.headers.etag, listTag('[]'))
})

t.test('gzip and Brotli by Accept-Encoding, identity otherwise', async t => {
  for (let i = 0; i < 40; i++) await create(`Category ${i}`, `the description of category number ${i}`)
  const expected = await expectedBody()
  t.ok(expected.length > 2048, 'the list is above the threshold')
  const identityTag = listTag(expected)

  for (const header of [undefined, 'identity', 'gzip;q=0', 'deflate', 'gzip;q=0, br;q=0']) {
    const got = await get(header === undefined ? {} : { 'accept-encoding': header })
    t.equal(got.headers['content-encoding'], undefined, `${String(header)}: identity`)
    t.equal(got.raw.toString(), expected)
    t.equal(got.headers['content-length'], String(got.raw.length))
    t.equal(got.headers.etag, identityTag, 'the strong tag of the bytes')
    t.equal(got.headers.vary, 'Accept-Encoding')
  }
  for (const [header, coding] of [
    ['gzip', 'gzip'],
    ['br', 'br'],
    ['gzip, br', 'br'],
    ['br;q=0.5, gzip', 'gzip'],
    ['gzip;q=0, *', 'br']
  ]) {
    const got = await get({ 'accept-encoding': header as string })
    t.equal(got.status, 200)
    t.equal(got.headers['content-encoding'], coding, `${header as string}: ${coding as string}`)
    t.equal(decoded(got), expected, 'decodes to exactly the list')
    t.ok(got.raw.length < expected.length / 3, `compressed: ${got.raw.length} of ${expected.length} bytes`)
    t.equal(got.headers['content-length'], String(got.raw.length))
    t.equal(got.headers.etag, `W/${identityTag.slice(0, -1)}-${coding as string}"`, 'a weak tag of its own')
    t.equal(got.headers.vary, 'Accept-Encoding')
    t.equal(got.headers['content-type'], 'application/json; charset=utf-8')
  }
})

t.test('If-None-Match: 304 for the tag of the coding the client gets, 200 for another', async t => {
  const gzip = await get({ 'accept-encoding': 'gzip' })
  const br = await get({ 'accept-encoding': 'br' })
  const plain = await get()
  const gzipTag = gzip.headers.etag as string
  const brTag = br.headers.etag as string
  const plainTag = plain.headers.etag as string
  t.not(gzipTag, brTag)
  t.not(gzipTag, plainTag)

  const notModified = await get({ 'accept-encoding': 'gzip', 'if-none-match': gzipTag })
  t.equal(notModified.status, 304)
  t.equal(notModified.raw.length, 0)
  t.equal(notModified.headers.etag, gzipTag)
  t.equal(notModified.headers.vary, 'Accept-Encoding')
  t.equal((await get({ 'accept-encoding': 'br', 'if-none-match': brTag })).status, 304)
  t.equal((await get({ 'if-none-match': plainTag })).status, 304)
  t.equal(
    (await get({ 'accept-encoding': 'gzip', 'if-none-match': `"x", ${gzipTag.slice(2)}` })).status,
    304,
    'compared weakly, in a list'
  )

  const other = await get({ 'accept-encoding': 'br', 'if-none-match': gzipTag })
  t.equal(other.status, 200, 'the gzip tag does not match the Brotli body')
  t.equal(other.headers.etag, brTag)
  t.equal(
    (await get({ 'accept-encoding': 'gzip', 'if-none-match': plainTag })).status,
    200,
    'nor the identity tag a gzip body'
  )
  t.equal((await get({ 'if-none-match': gzipTag })).status, 200, 'nor the gzip tag the identity body')
})

t.test('compressed once per list version and coding, however many read it; a create makes a new one', async t => {
  const before = { gzip: await compressions('gzip'), br: await compressions('br') }
  await create('one more for a new version')
  const expected = await expectedBody()
  const all = await Promise.all([
    ...Array.from({ length: 6 }, async () => await get({ 'accept-encoding': 'gzip' })),
    ...Array.from({ length: 6 }, async () => await get({ 'accept-encoding': 'br' }))
  ])
  for (let i = 0; i < 3; i++) all.push(await get({ 'accept-encoding': 'gzip' }), await get({ 'accept-encoding': 'br' }))
  for (const got of all) t.equal(decoded(got), expected)
  t.equal(await compressions('gzip'), before.gzip + 1, 'one gzip compression for 9 gzip reads')
  t.equal(await compressions('br'), before.br + 1, 'one Brotli compression for 9 Brotli reads')

  const old = all[0] as Got
  await create('and another')
  const changed = await get({ 'accept-encoding': 'gzip' })
  t.equal(decoded(changed), await expectedBody(), 'the compressed body has the new row')
  t.match(decoded(changed), /and another/)
  t.not(changed.headers.etag, old.headers.etag)
  t.equal(
    (await get({ 'accept-encoding': 'gzip', 'if-none-match': old.headers.etag as string })).status,
    200,
    'the old tag no longer matches'
  )
  t.equal(await compressions('gzip'), before.gzip + 2)
})

t.test('a list over 1 MiB, sent in parts, compresses to exactly its bytes', async t => {
  // Hex descriptions compress to about half: the compressed body is over 1 MiB as well, in parts of its own.
  await admin.query(`INSERT INTO categories (name, description)
    SELECT 'Bulk ' || i, md5(i::text) || md5(i::text || 'a') || md5(i::text || 'b') || md5(i::text || 'c')
    FROM generate_series(1, 20000) AS i`)
  const expected = await expectedBody()
  t.ok(expected.length > 3 * 1024 * 1024, `the list has ${expected.length} bytes`)
  await until('the list has the bulk rows', async () => (await get()).raw.toString() === expected, 20000, 50)
  for (const coding of ['gzip', 'br']) {
    const got = await get({ 'accept-encoding': coding })
    t.equal(got.headers['content-encoding'], coding)
    t.ok(got.raw.length > 1024 * 1024, `${coding}: ${got.raw.length} bytes on the wire`)
    t.equal(got.headers['content-length'], String(got.raw.length))
    t.equal(decoded(got), expected, `${coding} decodes to exactly the list`)
    t.equal(got.headers.etag, `W/${listTag(expected).slice(0, -1)}-${coding}"`)
  }
  const head = await app.inject({
    method: 'HEAD',
    url: '/v1/categories',
    headers: { ...AUTH, 'accept-encoding': 'gzip' }
  })
  t.equal(head.statusCode, 200)
  t.equal(head.headers['content-encoding'], 'gzip')
  t.equal(head.rawPayload.length, 0, 'HEAD sends no body')
})
