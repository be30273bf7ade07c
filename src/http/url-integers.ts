import { Type, type TSchema } from 'typebox'
import type { FastifyInstance, FastifySchemaCompiler } from 'fastify'
import { validationFailed } from './errors.js'
import { Int64Id } from './schemas.js'

// Integers in a URL (a path's id, a list's limit and after) are documented as integers, so that a generated client
// takes the id a create gave it. Ajv without coercion would refuse the text; with it, it would take `1e3` and `01`
// and round ids above 2^53: the route's validator compiler reads the text as a BigInt instead.

const MAX_INT64 = 9223372036854775807n
/** No sign, no leading zero. */
const CANONICAL_DECIMAL = /^(?:0|[1-9][0-9]*)$/
/** The most rows a page of a list holds. */
export const MAX_PAGE_ROWS = 10_000

export const Int64IdParams = Type.Object({
  id: Type.Unsafe<bigint>({ ...Int64Id, description: 'The id: a decimal integer from 1 to 9223372036854775807' })
}, { additionalProperties: false })

export const PageQuery = Type.Object({
  limit: Type.Optional(Type.Integer({
    minimum: 1,
    maximum: MAX_PAGE_ROWS,
    examples: [100],
    description: `A page: at most this many rows (1 to ${MAX_PAGE_ROWS}), in id order, and a Link header to the ` +
      'next page while rows follow'
  })),
  after: Type.Optional(Type.Unsafe<bigint>({
    ...Int64Id,
    description: 'With limit: the page starts after this id (the last id of the page before); without it, at the ' +
      'first row'
  }))
})

interface IntegerSchema { type?: unknown, minimum?: number, maximum?: number, format?: string }

const maximumOf = (schema: IntegerSchema): bigint =>
  schema.format === 'int64' ? MAX_INT64 : BigInt(schema.maximum ?? Number.MAX_SAFE_INTEGER)

export function integerMessage (name: string, schema: TSchema): string {
  const integer = schema as IntegerSchema
  return `'${name}' must be a decimal integer from ${integer.minimum ?? 0} to ${maximumOf(integer)}`
}

/** Reads one URL integer, or undefined when it is not one the schema allows. */
function integerOf (text: unknown, schema: IntegerSchema): bigint | number | undefined {
  if (typeof text !== 'string' || !CANONICAL_DECIMAL.test(text)) return undefined
  const value = BigInt(text)
  if (value < BigInt(schema.minimum ?? 0) || value > maximumOf(schema)) return undefined
  return schema.format === 'int64' ? value : Number(value)
}

// For a route whose params or querystring are made of integers (Int64IdParams, PageQuery); a member the schema does
// not name is left out. Its other parts keep the app's own Ajv, compiled on first use: the app's compiler exists
// only once the app is ready.
export function urlIntegersValidatorCompiler (app: FastifyInstance): FastifySchemaCompiler<unknown> {
  return (route) => {
    if (route.httpPart === 'params' || route.httpPart === 'querystring') {
      const { properties = {}, required = [] } = route.schema as
        { properties?: Record<string, IntegerSchema>, required?: string[] }
      for (const [name, schema] of Object.entries(properties)) {
        if (schema.type !== 'integer') throw new Error(`${route.method} ${route.url}: '${name}' is not an integer`)
      }
      return (data: Record<string, unknown>) => {
        const value: Record<string, bigint | number> = {}
        for (const [name, schema] of Object.entries(properties)) {
          if (data[name] === undefined && !required.includes(name)) continue
          const parsed = integerOf(data[name], schema)
          if (parsed === undefined) return { error: validationFailed(integerMessage(name, schema)) }
          value[name] = parsed
        }
        return { value }
      }
    }
    let validate: ReturnType<FastifySchemaCompiler<unknown>> | undefined
    return (data: unknown) => {
      validate ??= (app.validatorCompiler as FastifySchemaCompiler<unknown>)(route)
      if (validate(data) === true) return { value: data }
      // The shape Fastify gives an Ajv failure, so the error handler words it as for any route.
      const error = Object.assign(new Error('request validation failed'),
        { validation: validate.errors, validationContext: route.httpPart })
      return { error }
    }
  }
}
