import { Type } from 'typebox'
import type { FastifyInstance, FastifySchemaCompiler } from 'fastify'
import { validationFailed } from './errors.js'
import { Int64Id } from './schemas.js'

// A path's `id` is documented as an int64 integer, like the ids in bodies, so that a generated client takes the id
// a create gave it. Ajv without coercion would refuse the text; with it, it would take `1e3` and `01` and round ids
// above 2^53: the route's validator compiler reads the text as a BigInt instead.

export const Int64IdParams = Type.Object({
  id: Type.Unsafe<bigint>({ ...Int64Id, description: 'The id: a decimal integer from 1 to 9223372036854775807' })
}, { additionalProperties: false })

// No sign, no leading zero; the upper bound 2^63-1 is checked as a BigInt.
const CANONICAL_ID = /^[1-9][0-9]{0,18}$/
const MAX_ID = 9223372036854775807n
export const INVALID_ID = "'id' must be a decimal integer from 1 to 9223372036854775807"

// For a route whose params are Int64IdParams. Its other parts keep the app's own Ajv, compiled on first use: the
// app's compiler exists only once the app is ready.
export function int64IdValidatorCompiler (app: FastifyInstance): FastifySchemaCompiler<unknown> {
  return (route) => {
    if (route.httpPart === 'params') {
      const names = Object.keys((route.schema as { properties?: object }).properties ?? {})
      if (names.length !== 1 || names[0] !== 'id') {
        throw new Error(`${route.method} ${route.url}: int64IdValidatorCompiler validates Int64IdParams only, ` +
          `not ${names.join(', ')}`)
      }
      return ({ id }: { id?: unknown }) => typeof id === 'string' && CANONICAL_ID.test(id) && BigInt(id) <= MAX_ID
        ? { value: { id: BigInt(id) } }
        : { error: validationFailed(INVALID_ID) }
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
