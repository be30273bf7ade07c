import { isInteger, parse, stringify } from 'lossless-json'
import type { ErrorBody } from './generated/operations.js'

/*
 * What every generated method resolves to. Ids are int64 on the wire and `bigint` here:
 * JSON.parse would round any id above 2^53 (9007199254740993 becomes ...992), so response
 * bodies are parsed with lossless-json, and every JSON integer of a successful response
 * (in this API, only int64 ids) becomes a bigint.
 */

/** An answer: the parsed body of a success, or the API's Error body; the Response either way (headers, status). */
export type Result<T> =
  | { data: T, error?: undefined, response: Response }
  | { data?: undefined, error: ErrorBody, response: Response }

/** A list fetched with If-None-Match: 304 when it still has that ETag. */
export type ListResult<T> = Result<T> | { data?: undefined, error?: undefined, notModified: true, response: Response }

/** JSON text to a value with every integer as an exact bigint and other numbers as numbers. */
export function parseJson (text: string): unknown {
  return parse(text, null, value => isInteger(value) ? BigInt(value) : Number(value))
}

/** A value to JSON text, writing a bigint as an exact JSON integer (JSON.stringify throws on one). */
export function stringifyJson (value: unknown): string {
  return stringify(value) ?? 'null'
}

/** What openapi-fetch gives with parseAs: 'text'. */
interface RawAnswer { data?: string, error?: unknown, response: Response }

export function answer<T> ({ data, error, response }: RawAnswer): Result<T> {
  if (response.ok) return { data: parseJson(data ?? 'null') as T, response }
  if (typeof error === 'object' && error !== null && 'code' in error) return { error: error as ErrorBody, response }
  // Not the API's own answer (a proxy's page, a cut connection): nothing typed to return.
  throw new Error(`${response.status} ${response.statusText} without an Error body from ${response.url}`)
}

export function listAnswer<T> (raw: RawAnswer): ListResult<T> {
  return raw.response.status === 304 ? { notModified: true, response: raw.response } : answer<T>(raw)
}
