import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox'
import { Type } from 'typebox'
import t from 'tap'
import { Int64IdParams, urlIntegersValidatorCompiler } from '../../src/http/url-integers.js'
import { AUTH, json, testApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

const db = await testDatabase(t)
const { app } = await testApp(
  t,
  db.url,
  {},
  {
    // A route of another shape with the same id: a body beside it keeps the app's own validation.
    register: async app => {
      app.withTypeProvider<TypeBoxTypeProvider>().put(
        '/v1/int64-probe/:id',
        {
          schema: {
            params: Int64IdParams,
            body: Type.Object({ name: Type.String({ minLength: 1 }) }, { additionalProperties: false })
          },
          validatorCompiler: urlIntegersValidatorCompiler(app)
        },
        async request => ({ id: String(request.params.id), type: typeof request.params.id, name: request.body.name })
      )
    }
  }
)

const INVALID = {
  code: 'VALIDATION_FAILED',
  message: "'id' must be a decimal integer from 1 to 9223372036854775807",
  status: 400
}

t.test('the id path parameter has the type and format of Category.id', async t => {
  const doc = (await app.inject({ method: 'GET', url: '/docs/openapi.json' })).json()
  const [param] = doc.paths['/categories/{id}'].get.parameters
  t.match(param, { name: 'id', in: 'path', required: true })
  const category = doc.components.schemas.Category.properties.id
  t.same(
    { type: param.schema.type, format: param.schema.format, minimum: param.schema.minimum },
    { type: category.type, format: category.format, minimum: category.minimum }
  )
  t.same([param.schema.type, param.schema.format, param.schema.minimum], ['integer', 'int64', 1])
  t.notOk('pattern' in param.schema, "the text rule is the server's, not the document's")
})

t.test('every id that is not a canonical decimal from 1 to 2^63-1 is the documented 400', async t => {
  const malformed = [
    '',
    '0',
    '-1',
    '01',
    '00',
    '+1',
    '1.5',
    '1.0',
    '1e3',
    'abc',
    '0x10',
    '%201',
    '1%20',
    '%091',
    '9223372036854775808',
    '99999999999999999999',
    '18446744073709551616',
    '%EF%BC%91'
  ]
  for (const id of malformed) {
    const res = await app.inject({ method: 'GET', url: `/v1/categories/${id}`, headers: AUTH })
    t.equal(res.statusCode, 400, id)
    t.same(res.json(), INVALID, id)
  }
})

t.test('valid ids reach the handler as exact BigInts, across the whole int64 range', async t => {
  const created = await app.inject({ method: 'POST', url: '/v1/categories', ...json({ name: 'Dogs' }) })
  t.equal(created.statusCode, 201)
  const got = await app.inject({ method: 'GET', url: `/v1/categories/${created.json().id as number}`, headers: AUTH })
  t.equal(got.statusCode, 200)
  t.equal(got.json().name, 'Dogs')
  for (const id of ['9007199254740993', '9223372036854775807']) {
    const res = await app.inject({ method: 'GET', url: `/v1/categories/${id}`, headers: AUTH })
    t.same(res.json(), { code: 'NOT_FOUND', message: `no category with id ${id}`, status: 404 }, `${id} is not rounded`)
  }
})

t.test("the same validator on a route with a body: the id as a bigint, the body checked by the app's Ajv", async t => {
  const ok = await app.inject({ method: 'PUT', url: '/v1/int64-probe/9223372036854775807', ...json({ name: 'x' }) })
  t.same(ok.json(), { id: '9223372036854775807', type: 'bigint', name: 'x' })
  const badId = await app.inject({ method: 'PUT', url: '/v1/int64-probe/1e3', ...json({ name: 'x' }) })
  t.same(badId.json(), INVALID)
  const badBody = await app.inject({ method: 'PUT', url: '/v1/int64-probe/1', ...json({ name: 'x', extra: 1 }) })
  t.same(badBody.json(), {
    code: 'VALIDATION_FAILED',
    message: "request body has an unknown member 'extra'",
    status: 400
  })
  const emptyName = await app.inject({ method: 'PUT', url: '/v1/int64-probe/1', ...json({ name: '' }) })
  t.same(emptyName.json(), {
    code: 'VALIDATION_FAILED',
    message: "'name' must be at least 1 character long",
    status: 400
  })
})

t.test('a params or querystring member that is not an integer is refused when the route is built', async t => {
  const compile = urlIntegersValidatorCompiler(app)
  for (const httpPart of ['params', 'querystring']) {
    t.throws(
      () => compile({ schema: Type.Object({ petId: Type.String() }), method: 'GET', url: '/v1/x/:petId', httpPart }),
      /'petId' is not an integer/,
      httpPart
    )
  }
})
