import { Ajv2020 } from 'ajv/dist/2020.js'
import formats from 'ajv-formats'
import type { FastifyInstance, InjectOptions, LightMyRequestResponse } from 'fastify'
import fc from 'fast-check'
import t from 'tap'
import { AUTH, testApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

/*
 * Property-based tests over app.inject. Reproduce a failure with the seed (and
 * path) this file prints: FC_SEED=<seed> [FC_PATH=<path>] npm test -- test/interface/properties.test.ts
 * FC_RUNS multiplies the number of cases (default 1).
 */

const seed =
  process.env.FC_SEED !== undefined && process.env.FC_SEED !== ''
    ? Number(process.env.FC_SEED)
    : Math.floor(Math.random() * 2 ** 31)
const replayPath = process.env.FC_PATH !== undefined && process.env.FC_PATH !== '' ? process.env.FC_PATH : undefined
const scale = Number(process.env.FC_RUNS ?? '1')
t.comment(`fast-check seed ${seed} (replay: FC_SEED=${seed} npm test -- test/interface/properties.test.ts)`)
const params = (numRuns: number): fc.Parameters<unknown> => ({
  seed,
  numRuns: Math.max(1, Math.round(numRuns * scale)),
  ...(replayPath === undefined ? {} : { path: replayPath })
})

const db = await testDatabase(t)
// Many of the random requests carry no key: the failed-authentication limit would turn them all into 429 after 20.
const { app } = await testApp(t, db.url, { RATE_LIMIT_AUTH_FAILURES: '1000000' })

/* ---------- The OpenAPI document, served by the app, is the oracle ---------- */

const docRes = await app.inject({ method: 'GET', url: '/docs/openapi.json' })
const DOC_ID = 'https://petstore.test/openapi.json'
const doc = { ...(docRes.json() as Record<string, unknown>), $id: DOC_ID } as unknown as {
  paths: Record<
    string,
    Record<string, { responses?: Record<string, { content?: Record<string, { schema?: unknown }> }> }>
  >
}
const ajv = new Ajv2020({ strict: false, allErrors: true })
// ajv-formats is CommonJS: its default export arrives as the module object under NodeNext.
const addFormats = ((formats as unknown as { default?: unknown }).default ?? formats) as (ajv: Ajv2020) => void
addFormats(ajv)
ajv.addFormat('int64', { type: 'number', validate: (n: number) => Number.isInteger(n) })
ajv.addSchema(doc)
const pointer = (...parts: string[]): string =>
  '#/' + parts.map(p => p.replace(/~/g, '~0').replace(/\//g, '~1')).join('/')
const errorValidator = ajv.getSchema(`${DOC_ID}${pointer('components', 'schemas', 'Error')}`)
if (errorValidator === undefined) throw new Error('the OpenAPI document has no components.schemas.Error')

/** The document's path template for a request path under /v1, if any. */
function template (path: string): string | undefined {
  if (!path.startsWith('/v1/')) return undefined
  const rest = path.slice(3)
  for (const candidate of Object.keys(doc.paths)) {
    const pattern = new RegExp(
      '^' + candidate.replace(/[.*+?^$()|[\]\\]/g, '\\$&').replace(/\{[^}]+\}/g, '[^/]+') + '$'
    )
    if (pattern.test(rest)) return candidate
  }
  return undefined
}

/** Checks one response against the document and the Error rules; returns a description of what is wrong. */
function problemsWith (method: string, path: string, res: LightMyRequestResponse): string[] {
  const problems: string[] = []
  const status = res.statusCode
  // 501 is the contract's answer for the pets and orders operations (and must be documented there, checked below).
  if (status >= 500 && status !== 501) problems.push(`a ${status}`)
  if (method === 'HEAD' || status === 304 || status === 204) return problems
  const contentType = String(res.headers['content-type'] ?? '')
  let body: unknown
  try {
    body = JSON.parse(res.body)
  } catch {
    if (!path.startsWith('/docs')) problems.push(`body is not JSON: ${res.body.slice(0, 100)}`)
    return problems
  }
  if (status >= 400) {
    if (contentType !== 'application/json; charset=utf-8') problems.push(`error content-type ${contentType}`)
    const keys = body !== null && typeof body === 'object' ? Object.keys(body).sort().join() : ''
    if (keys !== 'code,message,status') problems.push(`error body members: ${keys}`)
    if ((body as { status?: unknown }).status !== status) {
      problems.push(`error status ${String((body as { status?: unknown }).status)} in a ${status}`)
    }
    if (errorValidator?.(body) !== true) {
      problems.push(`error body breaks the Error schema: ${ajv.errorsText(errorValidator?.errors)}`)
    }
  }
  const route = template(path)
  const operation = route === undefined ? undefined : doc.paths[route]?.[method.toLowerCase()]
  if (operation !== undefined) {
    const documented = operation.responses?.[String(status)]
    if (documented === undefined) {
      problems.push(`${method} ${route} answered ${status}, which its OpenAPI operation does not document`)
    } else if (documented.content?.['application/json']?.schema !== undefined) {
      const schema = pointer(
        'paths', route ?? '', method.toLowerCase(), 'responses', String(status), 'content', 'application/json', 'schema'
      )
      const validate = ajv.getSchema(`${DOC_ID}${schema}`)
      if (validate?.(body) !== true) {
        problems.push(
          `body breaks the documented ${status} schema: ${ajv.errorsText(validate?.errors)}: ${res.body.slice(0, 200)}`
        )
      }
    }
  }
  return problems
}

async function send (options: InjectOptions & { method: string; url: string }): Promise<LightMyRequestResponse> {
  const res = await app.inject(options)
  // The path the app was given: inject resolves the URL as a client would, so "/../docs" arrives as "/docs".
  const problems = problemsWith(options.method, (res.raw.req.url ?? '').split('?')[0] ?? '', res)
  if (problems.length > 0) {
    throw new Error(
      `${options.method} ${options.url} -> ${res.statusCode} ${res.body.slice(0, 300)}\n  ${problems.join('\n  ')}`
    )
  }
  return res
}

/* ---------- Generators ---------- */

/** One code point or lone surrogate, biased toward the characters the rules single out. */
const anyUnit = fc.oneof(
  { weight: 6, arbitrary: fc.string({ unit: 'binary', minLength: 1, maxLength: 1 }) },
  { weight: 4, arbitrary: fc.string({ unit: 'grapheme-ascii', minLength: 1, maxLength: 1 }) },
  { weight: 1, arbitrary: fc.integer({ min: 0xd800, max: 0xdfff }).map(c => String.fromCharCode(c)) },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      '\u0000',
      '\t',
      '\n',
      '\r',
      '\u007f',
      '\u0085',
      ' ',
      '\u00a0',
      '\u2028',
      '\ufeff',
      '\ufffd',
      '"',
      '\\',
      '😀'
    )
  }
)
const anyString = (maxLength: number): fc.Arbitrary<string> => fc.string({ unit: anyUnit, maxLength })

const JSON_TYPE = { ...AUTH, 'content-type': 'application/json' }
const accepted = new Map<string, { name: string; description?: string; rawName: string; rawDescription?: string }>()

/** The raw JSON text of a string member in a response body (not the parsed value). */
function rawMember (body: string, member: string): string | undefined {
  return new RegExp(`"${member}":("(?:[^"\\\\]|\\\\.)*")`).exec(body)?.[1]
}

async function create (
  payload: string | Buffer,
  headers: Record<string, string> = JSON_TYPE
): Promise<LightMyRequestResponse> {
  const res = await send({ method: 'POST', url: '/v1/categories', headers, payload })
  if (res.statusCode === 201) {
    const body = res.json() as { id: number; name: string; description?: string }
    const rawName = rawMember(res.body, 'name')
    if (rawName === undefined) throw new Error(`no raw name in ${res.body}`)
    accepted.set(String(body.id), {
      name: body.name,
      description: body.description,
      rawName,
      rawDescription: rawMember(res.body, 'description')
    })
    const read = await send({ method: 'GET', url: `/v1/categories/${body.id}`, headers: AUTH })
    if (read.statusCode !== 200) throw new Error(`created ${body.id} but GET answered ${read.statusCode}`)
    if (
      rawMember(read.body, 'name') !== rawName ||
      rawMember(read.body, 'description') !== rawMember(res.body, 'description')
    ) {
      throw new Error(`read back differs: created ${res.body}, read ${read.body}`)
    }
  }
  return res
}

/* ---------- Properties ---------- */

t.test('random names and descriptions over all of Unicode: 201 exactly as sent, or 400', async t => {
  await fc.assert(
    fc.asyncProperty(anyString(300), fc.option(anyString(2100), { nil: undefined }), async (name, description) => {
      const sent = description === undefined ? { name } : { name, description }
      const res = await create(JSON.stringify(sent))
      if (res.statusCode === 201) {
        const body = res.json() as { name: string; description?: string }
        if (body.name !== name || body.description !== description) {
          throw new Error(`stored differently: sent ${JSON.stringify(sent)}, got ${res.body}`)
        }
        if (rawMember(res.body, 'name') === undefined || JSON.parse(rawMember(res.body, 'name') ?? '') !== name) {
          throw new Error('raw name differs')
        }
      } else if (res.statusCode !== 400) {
        throw new Error(`expected 201 or 400, got ${res.statusCode}`)
      }
    }),
    params(800)
  )
  t.pass(`${accepted.size} categories accepted so far`)
})

t.test('random JSON values as bodies: never a 5xx, errors are Error bodies', async t => {
  const member = fc.oneof(
    fc.constantFrom('name', 'description', 'id', '__proto__', 'constructor', 'Name', 'descripton'),
    fc.string({ maxLength: 10 })
  )
  const objects = fc.dictionary(member, fc.jsonValue({ maxDepth: 2 }), { maxKeys: 4 })
  await fc.assert(
    fc.asyncProperty(fc.oneof(fc.jsonValue({ maxDepth: 3 }), objects), async value => {
      const res = await create(JSON.stringify(value) ?? 'null')
      if (![201, 400].includes(res.statusCode)) throw new Error(`expected 201 or 400, got ${res.statusCode}`)
    }),
    params(500)
  )
  t.pass()
})

t.test('random bytes as bodies: never a 5xx', async t => {
  const prefix = fc.constantFrom('', '{"name":"', '{"name":"a","description":"', '[', '"')
  const bytes = fc.oneof(
    fc.uint8Array({ maxLength: 200 }),
    fc.string({ unit: 'binary', maxLength: 50 }).map(s => new Uint8Array(Buffer.from(s, 'utf8')))
  )
  await fc.assert(
    fc.asyncProperty(prefix, bytes, fc.boolean(), async (start, tail, close) => {
      const payload = Buffer.concat([Buffer.from(start), tail, Buffer.from(close && start.startsWith('{') ? '"}' : '')])
      const res = await create(payload)
      if (![201, 400].includes(res.statusCode)) throw new Error(`expected 201 or 400, got ${res.statusCode}`)
    }),
    params(400)
  )
  t.pass()
})

const token = fc.string({
  unit: fc.constantFrom(...'abcdefghijklmnopqrstuvwxyz0123456789-_'.split('')),
  minLength: 1,
  maxLength: 20
})
const headerValue = fc.string({
  unit: fc.integer({ min: 0x20, max: 0x7e }).map(c => String.fromCharCode(c)),
  maxLength: 60
})
const contentType = fc.oneof(
  fc.constantFrom(
    'application/json',
    'application/json; charset=utf-8',
    'application/JSON; Charset="UTF-8"',
    'application/json; charset=latin1',
    'application/json;charset=utf-16',
    'text/plain',
    'application/x-www-form-urlencoded',
    'multipart/form-data; boundary=x',
    'application/merge-patch+json',
    'application/jsonx',
    ' application/json',
    'application/json;',
    '*/*',
    ''
  ),
  headerValue
)
const authorization = fc.oneof(
  fc.constant(AUTH.authorization),
  fc.constant(AUTH.authorization.replace('Bearer', 'bEaReR')),
  headerValue,
  fc.constant('Bearer'),
  fc.constant('Basic dXNlcjpwYXNz'),
  fc.constant(undefined)
)

t.test('random headers and content types: never a 5xx', async t => {
  const extra = fc.dictionary(
    token.filter(n => !['content-length', 'transfer-encoding', 'host', 'expect', 'connection', 'upgrade'].includes(n)),
    headerValue,
    { maxKeys: 4 }
  )
  const body = fc.oneof(
    fc.constant('{"name":"headers"}'),
    fc.constant(''),
    anyString(40).map(name => JSON.stringify({ name })),
    headerValue
  )
  await fc.assert(
    fc.asyncProperty(
      contentType,
      authorization,
      extra,
      body,
      fc.constantFrom('GET', 'POST', 'HEAD'),
      async (type, auth, headers, payload, method) => {
        const all: Record<string, string> = { ...headers, 'content-type': type }
        if (auth !== undefined) all.authorization = auth
        if (method === 'POST') await create(payload, all)
        else await send({ method, url: '/v1/categories', headers: all })
      }
    ),
    params(600)
  )
  t.pass()
})

t.test('random paths and methods: never a 5xx, every error an Error body', async t => {
  const segment = fc.oneof(
    fc.constantFrom(
      'v1',
      'categories',
      'pets',
      'store',
      'orders',
      'health',
      'live',
      'ready',
      'docs',
      '1',
      '0',
      '-1',
      '9223372036854775807',
      '9223372036854775808',
      '%00',
      '%2F',
      '..',
      '.',
      '',
      '%ZZ',
      '%C0%AF',
      '%F0%9F%98%80',
      '%ED%A0%80'
    ),
    token,
    anyString(8).map(s => encodeURIComponent(s.replace(/[\ud800-\udfff]/g, 'x')))
  )
  const path = fc
    .tuple(
      fc.boolean(),
      fc.array(segment, { maxLength: 4 }),
      fc.option(fc.constantFrom('?a=1', '?', '?api_key=x', '#frag'), { nil: '' })
    )
    .map(([v1, segments, query]) => `/${[...(v1 ? ['v1'] : []), ...segments].join('/')}${query}`)
  const method = fc.constantFrom('GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'HEAD', 'TRACE')
  await fc.assert(
    fc.asyncProperty(method, path, authorization, async (verb, url, auth) => {
      const headers: Record<string, string> = auth === undefined ? {} : { authorization: auth }
      if (['POST', 'PUT', 'PATCH'].includes(verb)) headers['content-type'] = 'application/json'
      await send({
        method: verb as InjectOptions['method'] & string,
        url,
        headers,
        ...(headers['content-type'] === undefined ? {} : { payload: '{"name":"path"}' })
      })
    }),
    params(800)
  )
  t.pass()
})

t.test('every accepted body reads back byte-for-byte identical in the list', async t => {
  const res = await send({ method: 'GET', url: '/v1/categories', headers: AUTH })
  t.equal(res.statusCode, 200)
  // Split the raw list into its objects' raw texts: ids are integers and strings are JSON-escaped, so "},{" only
  // appears between objects.
  const raw = new Map<string, string>()
  for (const match of res.body.matchAll(/\{"id":(\d+)((?:,"(?:name|description)":"(?:[^"\\]|\\.)*")*)\}/g)) {
    raw.set(match[1] ?? '', match[0])
  }
  let checked = 0
  for (const [id, expected] of accepted) {
    const text = raw.get(id)
    if (text === undefined) {
      t.fail(`id ${id} is missing from the list`)
      continue
    }
    if (rawMember(text, 'name') !== expected.rawName || rawMember(text, 'description') !== expected.rawDescription) {
      t.fail(`id ${id} differs: ${text}`)
    } else {
      checked++
    }
  }
  t.equal(checked, accepted.size, `${checked} accepted categories read back identical in the list`)
  t.ok(checked > 50, 'a meaningful number of bodies was accepted')
})

export type { FastifyInstance }
