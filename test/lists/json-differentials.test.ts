import t, { type Test } from 'tap'
import { AUTH, testApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

/*
 * JSON that different parsers read differently is refused (docs/hardening.md,
 * "Parser differentials"): a proxy, a WAF or an audit log must never see
 * another value than the one the service stores.
 */

const db = await testDatabase(t)
const { app } = await testApp(t, db.url)

async function post (
  payload: string
): Promise<{ status: number; body: { code: string; message: string; status: number } }> {
  const res = await app.inject({
    method: 'POST',
    url: '/v1/categories',
    headers: { ...AUTH, 'content-type': 'application/json' },
    payload
  })
  return { status: res.statusCode, body: res.json() }
}

async function rowCount (): Promise<number> {
  const res = await app.inject({ method: 'GET', url: '/v1/categories', headers: AUTH })
  return (res.json() as unknown[]).length
}

async function assertRefused (t: Test, payload: string, mention: RegExp, label: string): Promise<void> {
  const { status, body } = await post(payload)
  t.equal(status, 400, `${label}: 400`)
  t.same(Object.keys(body).sort(), ['code', 'message', 'status'], `${label}: Error shape`)
  t.equal(body.code, 'VALIDATION_FAILED', `${label}: VALIDATION_FAILED`)
  t.match(body.message, mention, `${label}: ${body.message}`)
}

t.test('a member name that appears twice, at any depth, is 400 naming it, and stores nothing', async t => {
  const before = await rowCount()
  const cases: Array<[string, string, RegExp]> = [
    ['top level', '{"name":"x","name":"y"}', /duplicate member 'name'/],
    ['optional member', '{"name":"x","description":"a","description":"b"}', /duplicate member 'description'/],
    ['same value twice', '{"name":"x","name":"x"}', /duplicate member 'name'/],
    ['spelt with an escape', '{"name":"x","n\\u0061me":"y"}', /duplicate member 'name'/],
    ['both escaped differently', '{"\\u006eame":"x","na\\u006De":"y"}', /duplicate member 'name'/],
    ['escaped solidus', '{"name":"x","a/b":1,"a\\/b":2}', /duplicate member 'a\/b'/],
    ['non-ASCII, raw and escaped', '{"name":"x","é":1,"\\u00e9":2}', /duplicate member 'é'/],
    ['astral, raw and as a pair', '{"name":"x","😀":1,"\\ud83d\\ude00":2}', /duplicate member '😀'/],
    ['__proto__', '{"name":"x","__proto__":{},"__proto__":[]}', /duplicate member '__proto__'/],
    ['empty name', '{"name":"x","":1,"":2}', /duplicate member ''/],
    ['depth 2', '{"name":"x","meta":{"a":1,"a":2}}', /duplicate member 'meta\.a'/],
    ['depth 3 through an array', '{"name":"x","l":[0,{"k":[{"z":1,"z":2}]}]}', /duplicate member 'l\.1\.k\.0\.z'/],
    ['inside the name member', '{"name":{"v":"x","v":"y"}}', /duplicate member 'name\.v'/],
    ['top-level array of objects', '[{"name":"x","name":"y"}]', /duplicate member '0\.name'/],
    [
      'far apart',
      `{"name":"x",${Array.from({ length: 500 }, (_, i) => `"m${i}":${i}`).join(',')},"m7":0}`,
      /duplicate member 'm7'/
    ],
    ['control character in the name', '{"name":"x","a\\u0000b":1,"a\\u0000b":2}', /duplicate member 'a\\u0000b'/]
  ]
  for (const [label, payload, mention] of cases) await assertRefused(t, payload, mention, label)
  t.equal(await rowCount(), before, 'no row was stored')
})

t.test('the same name in different objects, and names equal only after normalisation, are not duplicates', async t => {
  await assertRefused(t, '{"name":"x","a":{"k":1},"b":{"k":1}}', /unknown member 'a'/, 'same name in sibling objects')
  await assertRefused(
    t,
    '{"name":"x","é":1,"e\\u0301":2}',
    /unknown member 'é'/,
    'NFC and NFD spellings are different names'
  )
  await assertRefused(t, '{"name":"x","Name":"y"}', /unknown member 'Name'/, 'names are case-sensitive')
  const ok = await post('{"name":"plain","description":"d"}')
  t.equal(ok.status, 201, 'a body without duplicates is created')
})

t.test('a lone surrogate escape in a member name is 400', async t => {
  await assertRefused(t, '{"name":"x","\\ud800":1}', /lone surrogate/, 'high surrogate alone')
  await assertRefused(t, '{"name":"x","a\\udc00":1}', /lone surrogate/, 'low surrogate alone')
  // A parser that replaces lone surrogates with U+FFFD reads these two as one name.
  await assertRefused(t, '{"name":"x","\\ud800":1,"\\udbff":2}', /lone surrogate/, 'two names that collapse elsewhere')
  await assertRefused(
    t,
    '{"name":"x","nested":{"\\udfff":1}}',
    /lone surrogate: 'nested\.\\udfff'/,
    'nested, with its path'
  )
})

t.test('numbers beyond ±(2^53-1), or a non-zero number that underflows to 0, are 400 naming the member', async t => {
  const cases: Array<[string, string]> = [
    ['9007199254740992', '2^53'],
    ['-9007199254740993', 'below -(2^53-1)'],
    ['12345678901234567890', 'twenty digits'],
    ['1e400', 'overflows to Infinity'],
    ['-1e400', 'overflows to -Infinity'],
    ['1e-400', 'underflows to zero'],
    ['1e20', 'an integer beyond 2^53 written with an exponent'],
    ['9007199254740993.0', 'integer-valued with a fraction part'],
    ['1.5e300', 'in range for a double, but above 2^53 every double is an integer: not exact']
  ]
  for (const [number, label] of cases) {
    await assertRefused(t, `{"name":"x","n":${number}}`, /'n' is a number beyond/, label)
  }
  await assertRefused(t, '{"name":"x","l":[1,2,1e999]}', /'l\.2' is a number beyond/, 'inside an array')
  for (const number of [
    '9007199254740991',
    '-9007199254740991',
    '0.1',
    '-0',
    '0e-400',
    '4503599627370495.5',
    '5e-324',
    '2.2250738585072014e-308'
  ]) {
    await assertRefused(
      t,
      `{"name":"x","n":${number}}`,
      /unknown member 'n'/,
      `${number} is held by a double: only the schema refuses it`
    )
  }
})

t.test('nesting deeper than 32 levels is 400, however deep', async t => {
  const nested = (depth: number): string => `{"name":"x","deep":${'['.repeat(depth - 1)}${']'.repeat(depth - 1)}}`
  await assertRefused(t, nested(32), /unknown member 'deep'/, '32 levels pass the parser')
  await assertRefused(t, nested(33), /nested deeper than 32 levels/, '33 levels')
  await assertRefused(
    t,
    `{"name":${'{"a":'.repeat(10000)}1${'}'.repeat(10000)}}`,
    /nested deeper than 32 levels/,
    '10000 levels of objects'
  )
  await assertRefused(
    t,
    '['.repeat(30000) + ']'.repeat(30000),
    /nested deeper than 32 levels/,
    '30000 levels of arrays (within the 64 KiB body limit)'
  )
})

t.test('strings that merely look like structure are not mistaken for it', async t => {
  const res = await post(
    '{"name":"{\\"name\\":1,\\"name\\":2} [[[ ]]] \\\\","description":"\\"name\\": 1e999, \\\\\\" }"}'
  )
  t.equal(res.status, 201, 'quotes, backslashes and brackets inside strings')
})
