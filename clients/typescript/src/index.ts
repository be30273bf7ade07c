import createClient from 'openapi-fetch'
import { isInteger, parse, stringify } from 'lossless-json'
import type { components, operations, paths } from './generated/openapi.js'

/*
 * The Petstore API from TypeScript: one function per operation over openapi-fetch,
 * typed from the committed openapi.json. Ids are int64 on the wire and `bigint` here:
 * JSON.parse would round any id above 2^53 (9007199254740993 becomes ...992), so
 * response bodies are parsed with lossless-json, and every JSON integer of a
 * successful response (in this API, only int64 ids) becomes a bigint.
 */

export type { components, operations, paths }
export type Category = components['schemas']['Category']
export type NewCategory = components['schemas']['NewCategory']
/** The body of every error the API answers (4xx and 5xx). */
export type ErrorBody = components['schemas']['Error']

export interface PetstoreClientOptions {
  /** Scheme and host of a deployment, e.g. https://api.petstore.dev; the client adds the /v1 it was generated for. */
  baseUrl: string
  /** An API key, sent as `Authorization: Bearer <key>` with every request. */
  apiKey: string
  /** A fetch of your own (tests, proxies); globalThis.fetch by default. */
  fetch?: typeof globalThis.fetch
}

/** An answer: the parsed body of a success, or the API's Error body; the Response either way (headers, status). */
export type Result<T> =
  | { data: T, error?: undefined, response: Response }
  | { data?: undefined, error: ErrorBody, response: Response }

/** A list fetched with If-None-Match: 304 when it still has that ETag. */
export type ListResult<T> = Result<T> | { data?: undefined, error?: undefined, notModified: true, response: Response }

export const API_PREFIX = '/v1'

/** JSON text to a value with every integer as an exact bigint and other numbers as numbers. */
export function parseJson (text: string): unknown {
  return parse(text, null, value => isInteger(value) ? BigInt(value) : Number(value))
}

/** A value to JSON text, writing a bigint as an exact JSON integer (JSON.stringify throws on one). */
export function stringifyJson (value: unknown): string {
  return stringify(value) ?? 'null'
}

interface RawAnswer { data?: string, error?: unknown, response: Response }

function answer<T> ({ data, error, response }: RawAnswer): Result<T> {
  if (response.ok) return { data: parseJson(data ?? 'null') as T, response }
  if (typeof error === 'object' && error !== null && 'code' in error) return { error: error as ErrorBody, response }
  // Not the API's own answer (a proxy's page, a cut connection): nothing typed to return.
  throw new Error(`${response.status} ${response.statusText} without an Error body from ${response.url}`)
}

export function createPetstoreClient (options: PetstoreClientOptions) {
  const client = createClient<paths>({
    baseUrl: `${options.baseUrl.replace(/\/+$/, '')}${API_PREFIX}`,
    headers: { authorization: `Bearer ${options.apiKey}` },
    bodySerializer: stringifyJson,
    ...options.fetch === undefined ? {} : { fetch: options.fetch }
  })

  return {
    /** Every category, ordered by id. With `ifNoneMatch` (a previous answer's ETag header), 304 while the list is unchanged. */
    async listCategories (request: { ifNoneMatch?: string } = {}): Promise<ListResult<Category[]>> {
      const raw = await client.GET('/categories', {
        parseAs: 'text',
        headers: request.ifNoneMatch === undefined ? {} : { 'if-none-match': request.ifNoneMatch }
      })
      if (raw.response.status === 304) return { notModified: true, response: raw.response }
      return answer<Category[]>(raw)
    },

    /** Creates a category; 201 means it is committed. The same `idempotencyKey` makes a retry safe (replayed, not created twice). */
    async createCategory (body: NewCategory, request: { idempotencyKey?: string } = {}): Promise<Result<Category>> {
      return answer<Category>(await client.POST('/categories', {
        body,
        parseAs: 'text',
        params: { header: request.idempotencyKey === undefined ? {} : { 'idempotency-key': request.idempotencyKey } }
      }))
    },

    /** One category by its exact id (experimental operation: may change without notice). */
    async getCategory (id: bigint): Promise<Result<Category>> {
      return answer<Category>(await client.GET('/categories/{id}', { params: { path: { id } }, parseAs: 'text' }))
    },

    /** @deprecated Not implemented by the API: always the 501 Error body. */
    async getPet (petId: string): Promise<Result<never>> {
      return answer<never>(await client.GET('/pets/{petId}', { params: { path: { petId } }, parseAs: 'text' }))
    },

    /** Not implemented by the API yet: the 501 Error body. */
    async listOrders (): Promise<Result<never>> {
      return answer<never>(await client.GET('/store/orders', { parseAs: 'text' }))
    }
  }
}

export type PetstoreClient = ReturnType<typeof createPetstoreClient>
