import { createHash } from 'node:crypto'
import t from 'tap'
import { ConfigError, loadConfig } from '../src/config.js'

t.test('defaults outside production', async t => {
  const config = loadConfig({})
  t.equal(config.production, false)
  t.equal(config.databaseUrl, undefined, 'no DATABASE_URL: the embedded database is used')
  t.equal(config.port, 3000)
  t.equal(config.host, '127.0.0.1')
  t.equal(config.logLevel, 'info')
  t.equal(config.trustProxy, false)
  t.equal(config.bodyLimitBytes, 65536)
  t.same(config.apiKeyDigests, [], 'no keys: a development key will be created')
  t.equal(config.shutdown.drainMs, 0)
})

t.test('keys: plain and hashed, several at once', async t => {
  const digest = createHash('sha256').update('c').digest('hex')
  const config = loadConfig({ API_KEYS: 'a, b', API_KEY_SHA256: digest })
  t.same(config.apiKeyDigests.map(d => d.toString('hex')), [
    createHash('sha256').update('a').digest('hex'), createHash('sha256').update('b').digest('hex'), digest
  ])
})

t.test('bad values stop the start with a message naming the variable', async t => {
  const cases: Array<[Record<string, string>, RegExp]> = [
    [{ API_KEYS: '' }, /API_KEYS/],
    [{ API_KEYS: 'a,,b' }, /API_KEYS/],
    [{ API_KEYS: 'a, ' }, /API_KEYS/],
    [{ API_KEY_SHA256: 'abc' }, /API_KEY_SHA256/],
    [{ API_KEY_SHA256: 'z'.repeat(64) }, /API_KEY_SHA256/],
    [{ PORT: 'eighty' }, /PORT/],
    [{ PORT: '70000' }, /PORT/],
    [{ LOG_LEVEL: 'loud' }, /LOG_LEVEL/],
    [{ PETS_SUNSET: 'next year' }, /PETS_SUNSET/],
    [{ PETS_SUNSET: '2027-02-30' }, /PETS_SUNSET/],
    [{ DATABASE_URL: 'mysql://x' }, /DATABASE_URL/],
    [{ DB_POOL_MAX: '0' }, /DB_POOL_MAX/],
    [{ BODY_LIMIT_BYTES: '-1' }, /BODY_LIMIT_BYTES/],
    [{ NODE_ENV: 'production' }, /DATABASE_URL and API_KEYS or API_KEY_SHA256/],
    [{ NODE_ENV: 'production', DATABASE_URL: 'postgres://db/x' }, /requires API_KEYS or API_KEY_SHA256/],
    [{ NODE_ENV: 'production', API_KEYS: 'k' }, /requires DATABASE_URL to be set/]
  ]
  for (const [env, message] of cases) {
    t.throws(() => loadConfig(env), message, JSON.stringify(env))
    t.throws(() => loadConfig(env), ConfigError)
  }
})

t.test('production defaults', async t => {
  const config = loadConfig({ NODE_ENV: 'production', DATABASE_URL: 'postgres://db/x', API_KEYS: 'k', PETS_SUNSET: '2027-06-30', TRUST_PROXY: 'true' })
  t.equal(config.production, true)
  t.equal(config.shutdown.drainMs, 5000)
  t.equal(config.petsSunset, 'Wed, 30 Jun 2027 00:00:00 GMT')
  t.equal(config.trustProxy, true)
  t.equal(loadConfig({ TRUST_PROXY: '10.0.0.0/8' }).trustProxy, '10.0.0.0/8')
})
