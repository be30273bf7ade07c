import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyInstance } from 'fastify'
import t, { type Test } from 'tap'
import { sha256 } from '../../src/config.js'
import { generateKey, keyPrefix, wellFormedKey } from '../../src/keys/store.js'
import { AUTH, testApp, until } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { withClient } from '../helpers/pg-client.js'
import { TcpProxy } from '../helpers/tcp-proxy.js'

/*
 * Managed keys (src/keys/store.ts): two instances on one database, as a deployment runs them. Keys are written
 * with SQL as `npm run keys` writes them (test/keys-command.test.ts runs the command itself).
 */

const db = await testDatabase(t)
const FOLLOW_MS = 1000

interface NewKey {
  key: string
  id: string
}

async function sql (text: string, values: unknown[] = []): Promise<Array<Record<string, unknown>>> {
  return await withClient(db.url, async client => (await client.query(text, values)).rows)
}

async function issue (scope: 'read' | 'write', extra: { rate?: number; expiresInMs?: number } = {}): Promise<NewKey> {
  const key = generateKey()
  const [row] = await sql(
    `INSERT INTO api_keys (name, scope, prefix, digest, rate_limit_per_minute, expires_at)
    VALUES ($1, $2, $3, $4, $5, now() + $6::float8 * interval '1 millisecond') RETURNING id`,
    [`test ${scope}`, scope, keyPrefix(key), sha256(key), extra.rate ?? null, extra.expiresInMs ?? null]
  )
  return { key, id: String(row?.id) }
}

const revoke = async (id: string): Promise<void> => {
  await sql('UPDATE api_keys SET revoked_at = now() WHERE id = $1', [id])
}

async function list (app: FastifyInstance, key: string): Promise<number> {
  return (await app.inject({ url: '/v1/categories', headers: { authorization: `Bearer ${key}` } })).statusCode
}

/** How long until `app` answers `status` to a list with `key`; fails past FOLLOW_MS. */
async function follows (t: Test, app: FastifyInstance, key: string, status: number, what: string): Promise<void> {
  const started = performance.now()
  await until(`${what}: ${status}`, async () => (await list(app, key)) === status, 3000, 10)
  const ms = performance.now() - started
  t.ok(ms < FOLLOW_MS, `${what} within ${FOLLOW_MS} ms (${Math.round(ms)} ms)`)
}

t.test('the key format: a fixed prefix, base62, and a CRC32 checksum that refuses a typo', async t => {
  const key = generateKey()
  t.match(key, /^petstore_[0-9A-Za-z]{36}$/)
  t.ok(wellFormedKey(key))
  const last = key.at(-7) === 'a' ? 'b' : 'a'
  t.notOk(wellFormedKey(key.slice(0, -7) + last + key.slice(-6)), 'one character changed in the body')
  t.notOk(wellFormedKey(key.slice(0, -1) + (key.endsWith('0') ? '1' : '0')), 'one character changed in the checksum')
  t.not(generateKey(), key)
})

t.test('two instances: a key created, revoked or expired holds on both within a second', async t => {
  // Every refused poll of follows() is a failed authentication: the limit must not be what answers.
  const env = { RATE_LIMIT_AUTH_FAILURES: '1000000' }
  const { app: a } = await testApp(t, db.url, env)
  const { app: b } = await testApp(t, db.url, env)
  await until('both feeds hear', async () => a.changeFeed.listening && b.changeFeed.listening)
  const { key, id } = await issue('read')
  await follows(t, a, key, 200, 'created key accepted on A')
  await follows(t, b, key, 200, 'created key accepted on B')
  await revoke(id)
  await follows(t, a, key, 401, 'revoked key refused on A')
  await follows(t, b, key, 401, 'revoked key refused on B')

  const expiring = await issue('read', { expiresInMs: 1500 })
  await follows(t, b, expiring.key, 200, 'expiring key accepted on B')
  await sleep(1500)
  t.equal(await list(b, expiring.key), 401, 'refused once expired, with no change announced')
})

t.test('scopes: read lists and gets, write also creates; static keys have every scope', async t => {
  const { app, logs } = await testApp(t, db.url, { LOG_LEVEL: 'info' })
  const read = await issue('read')
  const write = await issue('write')
  await app.apiKeys.reload()
  const post = async (authorization: string): Promise<{ statusCode: number; json: () => unknown }> =>
    await app.inject({
      method: 'POST',
      url: '/v1/categories',
      headers: { authorization, 'content-type': 'application/json' },
      payload: { name: 'x' }
    })
  const refused = await post(`Bearer ${read.key}`)
  t.equal(refused.statusCode, 403)
  t.same(refused.json(), {
    code: 'FORBIDDEN',
    message: 'this API key has the read scope; POST needs a key with the write scope',
    status: 403
  })
  const created = await post(`Bearer ${write.key}`)
  t.equal(created.statusCode, 201)
  t.equal(await list(app, read.key), 200)
  const url = `/v1/categories/${(created.json() as { id: number }).id}`
  t.equal((await app.inject({ url, headers: { authorization: `Bearer ${read.key}` } })).statusCode, 200)
  t.equal((await post(AUTH.authorization)).statusCode, 201, 'a static key may create')

  const line = logs.lines
    .map(l => JSON.parse(l) as { msg: string; req?: { apiKeyId?: string }; statusCode?: number })
    .find(l => l.msg === 'request completed' && l.statusCode === 403)
  t.equal(line?.req?.apiKeyId, read.id, "the request's log line names the key by its id")
  t.notOk(
    logs.lines.some(l => l.includes(read.key) || l.includes(write.key)),
    'no log line holds a key'
  )
})

t.test('a mistyped, unknown, revoked or expired key is a failed authentication', async t => {
  const { app } = await testApp(t, db.url, { RATE_LIMIT_AUTH_FAILURES: '4' })
  const good = generateKey()
  const typo = good.slice(0, -1) + (good.endsWith('0') ? '1' : '0')
  const revoked = await issue('write')
  const expired = await issue('write', { expiresInMs: 1 })
  await revoke(revoked.id)
  await app.apiKeys.reload()
  const keys = { typo, unknown: good, revoked: revoked.key, expired: expired.key }
  for (const [what, key] of Object.entries(keys)) t.equal(await list(app, key), 401, what)
  const valid = await issue('write')
  await app.apiKeys.reload()
  t.equal(await list(app, valid.key), 429, 'the address is over the failed-authentication limit, even with a valid key')
})

t.test("RATE_LIMIT_PER_KEY_PER_MINUTE counts each managed key; a key's own limit overrides it", async t => {
  const { app } = await testApp(t, db.url, { RATE_LIMIT_PER_KEY_PER_MINUTE: '3' })
  const plain = await issue('read')
  const own = await issue('read', { rate: 1 })
  const other = await issue('read')
  await app.apiKeys.reload()
  // At once: each request must see its own count, not the count of the last one.
  const statuses = await Promise.all([1, 2, 3, 4].map(async () => await list(app, plain.key)))
  t.same(statuses.sort(), [200, 200, 200, 429])
  t.same([await list(app, own.key), await list(app, own.key)], [200, 429])
  t.equal(await list(app, other.key), 200, 'every key has a count of its own')
})

t.test('last use is recorded without a write per request: once, when the instance flushes', async t => {
  const { app } = await testApp(t, db.url)
  const { key, id } = await issue('read')
  await app.apiKeys.reload()
  t.equal(await list(app, key), 200)
  const before = await sql('SELECT last_used_at FROM api_keys WHERE id = $1', [id])
  t.equal(before[0]?.last_used_at, null, 'nothing written at the request')
  await app.close()
  const after = await sql('SELECT last_used_at FROM api_keys WHERE id = $1', [id])
  t.type(after[0]?.last_used_at, Date, 'written when the instance flushed (every 30 s, and at close)')
})

t.test(
  'the database unreachable: known keys authenticate, and a revocation made meanwhile holds once it is back',
  async t => {
    const target = new URL(db.url)
    const proxy = await TcpProxy.start({ host: target.hostname, port: Number(target.port) })
    t.teardown(async () => {
      await proxy.close()
    })
    const { app } = await testApp(t, proxy.url(db.url), { RATE_LIMIT_AUTH_FAILURES: '1000000' })
    const known = await issue('read')
    const revoked = await issue('read')
    await app.apiKeys.reload()
    t.equal(await list(app, known.key), 200)
    proxy.down()
    await until('the feed has lost its connection', async () => !app.changeFeed.listening)
    const during = await app.inject({ url: '/v1/categories', headers: { authorization: `Bearer ${known.key}` } })
    t.equal(during.statusCode, 503, 'the key is accepted; the list needs the database')
    t.equal(
      (await app.inject({ url: '/v1/categories/1', headers: { authorization: `Bearer ${generateKey()}` } })).statusCode,
      401,
      'an unknown key is still refused'
    )
    await revoke(revoked.id)
    await sleep(1000)
    t.equal(
      (await app.inject({ url: '/v1/categories/1', headers: { authorization: `Bearer ${revoked.key}` } })).statusCode,
      503,
      'the revocation cannot be heard yet: the key is known'
    )
    proxy.restore()
    await follows(t, app, revoked.key, 401, 'the revocation holds once the database is back')
    t.equal(await list(app, known.key), 200)
  }
)
