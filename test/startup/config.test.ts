import { createHash } from 'node:crypto'
import t from 'tap'
import { ConfigError, loadConfig } from '../../src/config.js'

t.test('defaults outside production', async t => {
  const config = loadConfig({})
  t.equal(config.production, false)
  t.equal(config.databaseUrl, undefined, 'no DATABASE_URL: the embedded database is used')
  t.equal(config.databaseDirectUrl, undefined)
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
  t.same(
    config.apiKeyDigests.map(d => d.toString('hex')),
    [createHash('sha256').update('a').digest('hex'), createHash('sha256').update('b').digest('hex'), digest]
  )
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
    [{ DATABASE_URL: 'postgres://pooler/x', DATABASE_DIRECT_URL: 'db:5432/x' }, /DATABASE_DIRECT_URL/],
    [{ DATABASE_DIRECT_URL: 'postgres://db/x' }, /DATABASE_DIRECT_URL is set without DATABASE_URL/],
    [{ DB_POOL_MAX: '0' }, /DB_POOL_MAX/],
    [{ BODY_LIMIT_BYTES: '-1' }, /BODY_LIMIT_BYTES/],
    [{ NODE_ENV: 'production' }, /^NODE_ENV=production requires DATABASE_URL and API_KEYS or API_KEY_SHA256 to/],
    [{ NODE_ENV: 'production', DATABASE_URL: 'postgres://db/x' }, /requires API_KEYS or API_KEY_SHA256/],
    [{ NODE_ENV: 'production', API_KEYS: 'k' }, /requires DATABASE_URL to be set/]
  ]
  for (const [env, message] of cases) {
    t.throws(() => loadConfig(env), message, JSON.stringify(env))
    t.throws(() => loadConfig(env), ConfigError)
  }
})

t.test(
  "a key left at the example configuration's placeholder is refused, naming the variable, without echoing the value",
  async t => {
    const digestOf = (key: string): string => createHash('sha256').update(key).digest('hex')
    const cases: Array<[Record<string, string>, RegExp]> = [
      [
        { API_KEYS: 'change-me-api-key' },
        /^API_KEYS entry 1 is a placeholder \(it starts with "change-me"\); replace it with a real key/
      ],
      [{ API_KEYS: 'real-key-1, CHANGE-ME-too' }, /^API_KEYS entry 2 is a placeholder/],
      [{ API_KEYS: 'change-me' }, /^API_KEYS entry 1 is a placeholder/],
      [
        { API_KEY_SHA256: digestOf('change-me-api-key').toUpperCase() },
        /^API_KEY_SHA256 entry 1 is the digest of a placeholder key/
      ],
      [
        { NODE_ENV: 'production', DATABASE_URL: 'postgres://db/x', API_KEYS: 'change-me-api-key' },
        /^API_KEYS entry 1 is a placeholder/
      ]
    ]
    for (const [env, message] of cases) {
      t.throws(() => loadConfig(env), message, JSON.stringify(env))
      t.throws(() => loadConfig(env), ConfigError)
    }
    t.throws(
      () => loadConfig({ API_KEYS: 'change-me-secret-value' }),
      { message: /^(?!.*secret-value)/ },
      'the value itself is not in the message'
    )
    t.equal(
      loadConfig({ API_KEYS: 'not-change-me' }).apiKeyDigests.length,
      1,
      'only a key that starts with the placeholder is refused'
    )
  }
)

t.test('production defaults', async t => {
  const config = loadConfig({
    NODE_ENV: 'production',
    DATABASE_URL: 'postgres://db/x',
    API_KEYS: 'k',
    PETS_SUNSET: '2027-06-30',
    TRUST_PROXY: 'true'
  })
  t.equal(config.production, true)
  t.equal(config.shutdown.drainMs, 5000)
  t.equal(config.petsSunset, 'Wed, 30 Jun 2027 00:00:00 GMT')
  t.equal(config.trustProxy, true)
  t.equal(loadConfig({ TRUST_PROXY: '10.0.0.0/8' }).trustProxy, '10.0.0.0/8')
  t.equal(
    loadConfig({ DATABASE_URL: 'postgres://pooler/x', DATABASE_DIRECT_URL: 'postgres://db/x' }).databaseDirectUrl,
    'postgres://db/x'
  )
})

t.test('REDIS_URL: optional, checked, and never quoted in an error (it may hold a password)', async t => {
  t.equal(loadConfig({}).redis, undefined, 'unset: limits count per instance')
  t.same(loadConfig({ REDIS_URL: 'redis://:pw@cache:6380/2' }).redis, {
    url: 'redis://:pw@cache:6380/2',
    timeoutMs: 100
  })
  t.same(loadConfig({ REDIS_URL: 'rediss://cache', REDIS_TIMEOUT_MS: '250' }).redis, {
    url: 'rediss://cache',
    timeoutMs: 250
  })
  for (const url of ['http://user:hunter2@cache', 'redis://', 'cache:6379', 'redis://user:hunter2@[bad', 'hunter2']) {
    t.throws(() => loadConfig({ REDIS_URL: url }), ConfigError)
    let message = ''
    try {
      loadConfig({ REDIS_URL: url })
    } catch (err) {
      message = (err as Error).message
    }
    t.match(message, /REDIS_URL/, url)
    t.notMatch(message, /hunter2/, 'the value is not repeated')
  }
  t.throws(() => loadConfig({ REDIS_URL: 'redis://cache', REDIS_TIMEOUT_MS: '0' }), /REDIS_TIMEOUT_MS/)
})
