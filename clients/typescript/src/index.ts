import createClient from 'openapi-fetch'
import type { paths } from './generated/openapi.js'
import { operationMethods } from './generated/operations.js'
import { stringifyJson } from './result.js'

/*
 * The Petstore API from TypeScript: one method per operation (generated from the committed
 * openapi.json into ./generated/operations.ts by `npm run api:generate`) over openapi-fetch,
 * with ids as exact bigints (./result.ts).
 */

export type { components, operations, paths } from './generated/openapi.js'
export type * from './generated/operations.js'
export { parseJson, stringifyJson, type ListResult, type Result } from './result.js'

export interface PetstoreClientOptions {
  /** Scheme and host of a deployment, e.g. https://api.petstore.dev; the client adds the /v1 it was generated for. */
  baseUrl: string
  /** An API key, sent as `Authorization: Bearer <key>` with every request. */
  apiKey: string
  /** A fetch of your own (tests, proxies); globalThis.fetch by default. */
  fetch?: typeof globalThis.fetch
}

export const API_PREFIX = '/v1'

export function createPetstoreClient (options: PetstoreClientOptions) {
  return operationMethods(createClient<paths>({
    baseUrl: `${options.baseUrl.replace(/\/+$/, '')}${API_PREFIX}`,
    headers: { authorization: `Bearer ${options.apiKey}` },
    bodySerializer: stringifyJson,
    ...options.fetch === undefined ? {} : { fetch: options.fetch }
  }))
}

export type PetstoreClient = ReturnType<typeof createPetstoreClient>
