import { Ajv2020 } from 'ajv/dist/2020.js'
import t from 'tap'
import { ErrorCodes, MALFORMED_JSON } from '../../src/http/errors.js'
import { AUTH, testApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

const db = await testDatabase(t)
const { app } = await testApp(t, db.url)

const res = await app.inject({ method: 'GET', url: '/docs/openapi.json' })
const doc = res.json()
type Operation = {
  operationId?: string
  security?: unknown
  deprecated?: boolean
  description?: string
  responses: Record<string, any>
  'x-stability'?: string
}
const operations: Array<[string, string, Operation]> = Object.entries(
  doc.paths as Record<string, Record<string, Operation>>
).flatMap(([path, item]) =>
  Object.entries(item).map(([method, op]) => [path, method, op] as [string, string, Operation])
)

t.equal(res.statusCode, 200)
t.equal(doc.openapi, '3.1.0')
t.equal(doc.info.version, '1.0.0')

t.test(
  'servers: this deployment first (relative, so "Try it out" calls the server of the page), ' +
    'then production and staging, all ending in /v1',
  async t => {
    t.same(doc.servers[0], { url: '/v1', description: 'This deployment (the server that serves this document)' })
    t.same(
      doc.servers.slice(1).map((s: { description: string }) => s.description),
      ['Production', 'Staging']
    )
    for (const server of doc.servers.slice(1)) {
      t.match(server.url, /^\{base_url\}\/v1$/)
      t.match(server.variables.base_url.default, /^https:\/\//)
    }
    for (const path of ['/categories', '/categories/{id}', '/pets/{petId}', '/store/orders']) {
      t.ok(doc.paths[path], path)
    }
  }
)

t.test('every operation of the document is a route under /v1', async t => {
  for (const [path, method] of operations) {
    const url = `/v1${path.replace(/\{([^}]+)\}/g, ':$1')}`
    t.ok(app.hasRoute({ method: method.toUpperCase() as 'GET', url }), `${method.toUpperCase()} ${url}`)
  }
})

t.test('bearer security on every operation', async t => {
  t.same(doc.components.securitySchemes.bearer, {
    type: 'http',
    scheme: 'bearer',
    description: doc.components.securitySchemes.bearer.description
  })
  t.same(doc.security, [{ bearer: [] }])
  for (const [path, method, op] of operations) t.same(op.security, [{ bearer: [] }], `${method} ${path}`)
})

t.test('operation ids, stability and deprecation', async t => {
  const ids = Object.fromEntries(operations.map(([path, method, op]) => [`${method} ${path}`, op.operationId]))
  t.equal(ids['get /categories'], 'listCategories')
  t.equal(ids['post /categories'], 'createCategory')
  t.equal(ids['get /categories/{id}'], 'getCategory')
  t.equal(doc.paths['/categories/{id}'].get['x-stability'], 'experimental')
  for (const [, , op] of operations) {
    if (op['x-stability'] !== undefined) t.match(op['x-stability'], /^(experimental|beta)$/)
  }
  t.match(
    doc.paths['/categories/{id}'].get.summary,
    /\(experimental\)$/,
    'the stability is in the summary a reader scans'
  )
  t.match(
    doc.paths['/categories/{id}'].get.description,
    /^Experimental: may change incompatibly/,
    'and its meaning leads the description'
  )
  t.equal(doc.paths['/pets/{petId}'].get.deprecated, true)
  t.notOk(doc.paths['/categories'].get.deprecated)
  for (const path of ['/pets/{petId}', '/store/orders']) {
    t.ok(doc.paths[path].get.responses['501'], `${path} documents 501`)
  }
  for (const [path, method, op] of operations.filter(([, , op]) => op.responses['501'] !== undefined)) {
    t.match(
      op.description,
      /not defined yet/,
      `${method} ${path} (a placeholder) says its behaviour is not defined yet`
    )
    t.notOk(
      Object.keys(op.responses).some(status => status.startsWith('2')),
      `${method} ${path}: a placeholder has no success`
    )
  }
})

t.test('every documented error status uses the Error schema; schemas come from the same TypeBox values', async t => {
  for (const [path, method, op] of operations) {
    for (const [status, response] of Object.entries(op.responses)) {
      if (Number(status) >= 400) {
        t.same(
          response.content['application/json'].schema,
          { $ref: '#/components/schemas/Error' },
          `${method} ${path} ${status}`
        )
      }
    }
    for (const [status, response] of Object.entries(op.responses)) {
      t.not(response.description, 'Default Response', `${method} ${path} ${status} has a description of its own`)
    }
    t.ok(op.responses['401'], `${method} ${path} documents 401`)
  }
  t.same(doc.components.schemas.Error.required, ['code', 'message', 'status'])
  t.equal(doc.components.schemas.Error.additionalProperties, false)
  t.equal(doc.components.schemas.NewCategory.additionalProperties, false)
  t.same(doc.components.schemas.Category.properties.id, {
    ...doc.components.schemas.Category.properties.id,
    type: 'integer',
    format: 'int64'
  })
  t.same(doc.paths['/categories'].post.requestBody.content['application/json'].schema, {
    $ref: '#/components/schemas/NewCategory'
  })
})

t.test(
  'DEL, the C1 controls, U+2028 and U+2029 are served escaped: YAML 1.1 tools (PyYAML, Dredd) refuse or fold them raw',
  async t => {
    for (const url of ['/docs/openapi.json', '/docs/json']) {
      const served = await app.inject({ method: 'GET', url })
      t.notMatch(served.body, /[\u007f-\u009f\u2028\u2029]/, `${url}: none of them raw`)
      t.match(served.body, /\[\^\\u0000-\\u001f\\u007f-\\u009f\]/, `${url}: the patterns name them as escapes`)
      t.same(JSON.parse(served.body), doc, `${url}: the same document to a JSON parser`)
    }
  }
)

t.test('operational routes are not in the document, and the reference page is served', async t => {
  t.notOk(JSON.stringify(doc.paths).includes('/health'))
  const page = await app.inject({ method: 'GET', url: '/docs/' })
  t.equal(page.statusCode, 200)
  t.match(page.headers['content-type'], /text\/html/)
})

/** Every error example of the document, by operation and status. */
function errorExamples (): Array<{
  operation: string
  status: number
  example: { code: string; message: string; status: number }
}> {
  return operations.flatMap(([, , op]) =>
    Object.entries(op.responses)
      .filter(([status]) => Number(status) >= 400)
      .flatMap(([status, response]) => {
        const media = response.content['application/json']
        const examples =
          media.example !== undefined ? [media.example] : Object.values(media.examples ?? {}).map((e: any) => e.value)
        return examples.map(example => ({ operation: op.operationId ?? '', status: Number(status), example }))
      })
  )
}

t.test(
  'every error response shows a true example: ' +
    'an Error with the status of the response and a code of the contract for it',
  async t => {
    const ajv = new Ajv2020({ strict: false })
    const validError = ajv.compile(doc.components.schemas.Error)
    for (const [path, method, op] of operations) {
      for (const [status, response] of Object.entries(op.responses)) {
        if (Number(status) < 400) continue
        const media = response.content['application/json']
        t.ok(
          media.example !== undefined || Object.keys(media.examples ?? {}).length > 0,
          `${method} ${path} ${status} has an example`
        )
      }
    }
    for (const { operation, status, example } of errorExamples()) {
      const where = `${operation} ${status}`
      t.ok(validError(example), `${where}: a valid Error`)
      t.equal(example.status, status, `${where}: status equals the response code`)
      const codes =
        status === 400 ? [ErrorCodes[400], MALFORMED_JSON] : [(ErrorCodes as Record<number, string>)[status]]
      t.ok(codes.includes(example.code), `${where}: ${example.code} is the contract's code for ${status}`)
      t.notMatch(example.message, /^[A-Z_]+$/, `${where}: a message, not the code again`)
    }
  }
)

t.test("getPet: a petId over 100 characters is 400 (one that is not a valid URL part: the examples' test)", async t => {
  const res = await app.inject({ url: `/v1/pets/${'x'.repeat(101)}`, headers: AUTH })
  t.equal(res.statusCode, 400)
  t.equal(res.json().code, 'VALIDATION_FAILED')
})

t.test('the examples are what the service answers', async t => {
  const { app: limited } = await testApp(t, db.url, { RATE_LIMIT_AUTH_FAILURES: '1' })
  const examples = errorExamples()
  const example = (operation: string, status: number, code?: string): unknown =>
    examples.find(
      e => e.operation === operation && e.status === status && (code === undefined || e.example.code === code)
    )?.example
  const json = (body: string): { headers: Record<string, string>; payload: string } => ({
    headers: { ...AUTH, 'content-type': 'application/json' },
    payload: body
  })
  const answers: Array<[string, number, string | undefined, Promise<{ json: () => unknown }>]> = [
    ['listCategories', 401, undefined, app.inject({ url: '/v1/categories' })],
    ['createCategory', 400, 'VALIDATION_FAILED', app.inject({ method: 'POST', url: '/v1/categories', ...json('{}') })],
    ['createCategory', 400, MALFORMED_JSON, app.inject({ method: 'POST', url: '/v1/categories', ...json('{"name":') })],
    [
      'createCategory',
      413,
      undefined,
      app.inject({ method: 'POST', url: '/v1/categories', ...json(JSON.stringify({ name: 'x'.repeat(70000) })) })
    ],
    [
      'createCategory',
      415,
      undefined,
      app.inject({
        method: 'POST',
        url: '/v1/categories',
        headers: { ...AUTH, 'content-type': 'text/plain' },
        payload: 'Dogs'
      })
    ],
    ['getCategory', 400, undefined, app.inject({ url: '/v1/categories/abc', headers: AUTH })],
    ['getCategory', 404, undefined, app.inject({ url: '/v1/categories/42', headers: AUTH })],
    // A path parameter that is not valid percent-encoding: found by properties.test.ts (GET /v1/pets/%ZZ).
    ['getPet', 400, undefined, app.inject({ url: '/v1/pets/%ZZ', headers: AUTH })],
    ['getPet', 501, undefined, app.inject({ url: '/v1/pets/1', headers: AUTH })],
    ['listOrders', 501, undefined, app.inject({ url: '/v1/store/orders', headers: AUTH })]
  ]
  for (const [operation, status, code, answer] of answers) {
    t.same(
      (await answer).json(),
      example(operation, status, code),
      `${operation} ${status}${code === undefined ? '' : ` ${code}`}`
    )
  }
  const first = await app.inject({
    method: 'POST',
    url: '/v1/categories',
    headers: { ...AUTH, 'content-type': 'application/json', 'idempotency-key': 'k-422' },
    payload: '{"name":"a"}'
  })
  t.equal(first.statusCode, 201)
  const reused = await app.inject({
    method: 'POST',
    url: '/v1/categories',
    headers: { ...AUTH, 'content-type': 'application/json', 'idempotency-key': 'k-422' },
    payload: '{"name":"b"}'
  })
  t.same(reused.json(), example('createCategory', 422))
  await limited.inject({ url: '/v1/categories', headers: { authorization: 'Bearer wrong' } })
  const limitedAnswer = await limited.inject({ url: '/v1/categories', headers: { authorization: 'Bearer wrong' } })
  const seconds = (value: unknown): unknown =>
    JSON.parse(JSON.stringify(value).replace(/retry in \d+ s/, 'retry in N s'))
  t.same(
    seconds(limitedAnswer.json()),
    seconds(example('listCategories', 429)),
    'listCategories 429 (the seconds vary)'
  )
})

t.test(
  'the reference page: upgrade-insecure-requests only over https, which TRUST_PROXY decides for a proxy',
  async t => {
    const { app: proxied } = await testApp(t, db.url, { TRUST_PROXY: 'true' })
    const csp = async (target: typeof app, headers: Record<string, string> = {}): Promise<string> =>
      String((await target.inject({ url: '/docs/', headers })).headers['content-security-policy'])
    t.notMatch(await csp(app), /upgrade-insecure-requests/, 'plain HTTP: the page loads its scripts over HTTP')
    t.match(await csp(app), /script-src 'self'/)
    t.notMatch(
      await csp(app, { 'x-forwarded-proto': 'https' }),
      /upgrade-insecure-requests/,
      'an untrusted X-Forwarded-Proto changes nothing'
    )
    t.match(
      await csp(proxied, { 'x-forwarded-proto': 'https' }),
      /; upgrade-insecure-requests$/,
      'behind a TLS-terminating proxy that is trusted: upgraded'
    )
    t.notMatch(await csp(proxied, { 'x-forwarded-proto': 'http' }), /upgrade-insecure-requests/)
    for (const file of ['/docs/static/swagger-ui-bundle.js', '/docs/static/swagger-initializer.js']) {
      const asset = await app.inject({ url: file })
      t.equal(asset.statusCode, 200, file)
      t.notMatch(String(asset.headers['content-security-policy']), /upgrade-insecure-requests/, `${file}: same policy`)
    }
    const initializer = (await app.inject({ url: '/docs/static/swagger-initializer.js' })).body
    t.match(initializer, /"showExtensions":true/, 'x-stability is listed under the operation')
    t.same(
      (await app.inject({ url: '/docs/json' })).json(),
      doc,
      'the page shows the same document as /docs/openapi.json'
    )
  }
)
