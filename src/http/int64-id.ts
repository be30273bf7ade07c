import { Type } from 'typebox'
import type { FastifyInstance, FastifySchemaCompiler } from 'fastify'
import { ID_PATTERN, MAX_ID, patternRules } from '../shared/text-rules.js'
import { validationFailed } from './errors.js'
import { Int64Id } from './schemas.js'

/*
 * The `id` of a path (`/:id`) is documented with the type and format of the ids in
 * bodies (an int64 integer), so that a generated client takes the id it got from a
 * create. A path segment is text, and Ajv without type coercion (the contract forbids
 * it) would refuse it, while with coercion it would accept `1e3` and `01` and round
 * ids above 2^53: the route's own validator compiler reads the text as a BigInt instead.
 */

/** The params of a `/:id` route: the handler gets `request.params.id` as a bigint. */
export const Int64IdParams = Type.Object({
  id: Type.Unsafe<bigint>({ ...Int64Id, description: 'The id: a decimal integer from 1 to 9223372036854775807' })
}, { additionalProperties: false })

const CANONICAL_ID = new RegExp(ID_PATTERN, 'u')
const INVALID_ID = `'id' ${patternRules[ID_PATTERN] ?? 'must be a decimal integer'}`

/** An id as written in a path: a canonical decimal integer from 1 to 2^63-1, else the documented 400. */
export function parseIdSegment (text: unknown): bigint {
  if (typeof text !== 'string' || !CANONICAL_ID.test(text)) throw validationFailed(INVALID_ID)
  const id = BigInt(text)
  if (id > MAX_ID) throw validationFailed(INVALID_ID)
  return id
}

type Validator = (data: unknown) => boolean | { errors?: unknown }

/**
 * The `validatorCompiler` of a route whose params are Int64IdParams. The route's other
 * parts (a body, headers) keep the app's own Ajv validation, compiled on first use: the
 * app's compiler exists once the app is ready (any route with a body schema sets it up).
 */
export function int64IdValidatorCompiler (app: FastifyInstance): FastifySchemaCompiler<unknown> {
  return (route) => {
    if (route.httpPart === 'params') {
      const names = Object.keys((route.schema as { properties?: object }).properties ?? {})
      if (names.length !== 1 || names[0] !== 'id') throw new Error(`${route.method} ${route.url}: int64IdValidatorCompiler validates Int64IdParams only, not ${names.join(', ')}`)
      return (params: { id?: unknown }) => {
        try {
          return { value: { id: parseIdSegment(params.id) } }
        } catch (error) {
          return { error: error as Error }
        }
      }
    }
    let validate: (Validator & { errors?: unknown }) | undefined
    return (data: unknown) => {
      if (validate === undefined) {
        const compiler = app.validatorCompiler
        if (compiler === undefined || compiler === null) throw new Error(`${route.method} ${route.url}: the app has no validator compiler to check its ${route.httpPart ?? 'input'}`)
        validate = compiler(route) as Validator
      }
      if (validate(data) === true) return { value: data }
      // The shape Fastify gives an Ajv failure, so the error handler words it as for any route.
      return { error: Object.assign(new Error('request validation failed'), { validation: validate.errors, validationContext: route.httpPart }) }
    }
  }
}
