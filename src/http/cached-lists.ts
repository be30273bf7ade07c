import type { IncomingMessage, ServerResponse } from 'node:http'
import { performance } from 'node:perf_hooks'
import type { FastifyInstance, RouteOptions } from 'fastify'
import { Counter, type Registry } from 'prom-client'
import { rememberedKey, type AccessLimits } from './auth.js'
import { requestId, type Lifecycle } from './lifecycle.js'
import type { RequestDurations } from './metrics.js'
import { LISTED, ifNoneMatchHits, type ListBody, type ListRouteHandler } from './replies.js'
import { repeatedSingleton } from './singleton-headers.js'

/** Route options that change what Fastify does with a request (its own hooks, constraints, log level): a route with any of them is always left to Fastify. */
const ROUTE_EXTRAS = ['onRequest', 'preParsing', 'preValidation', 'preHandler', 'preSerialization', 'onSend', 'onResponse', 'onTimeout', 'onError', 'onRequestAbort', 'constraints', 'logLevel'] as const

/** Fastify fills some route options with an empty value ('' for logLevel when no plugin sets one). */
const given = (value: unknown): boolean => value !== undefined && value !== null && value !== '' && !(Array.isArray(value) && value.length === 0)

const JSON_TYPE = 'application/json; charset=utf-8'

type Logger = FastifyInstance['log'] & { isLevelEnabled: (level: string) => boolean }

export interface CachedListOptions {
  lifecycle: Lifecycle
  /** The request histogram app.ts's onResponse hook observes. */
  durations: RequestDurations
  registry: Registry
}

/**
 * GET of a cached list (a route made by replies.ts's listHandler), answered
 * in Node's 'request' event before Fastify sees the request: the cached Buffer
 * and its ETag, or the 304, written straight to the response. Fastify's
 * request and reply objects and its hook runner were most of what a cached GET
 * and a 304 cost beyond Node's own HTTP (docs/performance.md, issue 12).
 *
 * It answers only a request whose every step through Fastify would end in
 * exactly this response, and leaves any other to Fastify, unchanged:
 * - GET, the route's exact path (no query string), not shutting down nor
 *   closing (Fastify adds Connection: close), and no line to log (at `debug`
 *   every request is logged; at `info` a successful one is not);
 * - the Authorization header this connection already presented with a valid
 *   key (auth.ts remembers it after Fastify's access hook verified it): so the
 *   first request on every connection, and any other header, goes through
 *   Fastify, including every 401;
 * - no limit that could refuse a valid key (AccessLimits.mayRefuseVerified:
 *   no per-key limit, no Redis, no failed authentication from anywhere within
 *   the window), so the failed-authentication 429 is always Fastify's;
 * - no singleton header sent twice (singleton-headers.ts's 400);
 * - the list is cached (ListCache.cached: the change feed hears, and no own
 *   create waits to be appended), else the route reads it.
 *
 * What the app's hooks add, it adds the same way: X-Request-Id (lifecycle.ts's
 * requestId), the request histogram under the route's pattern (timed from the
 * 'request' event to the end of the write, where Fastify's hook times to the
 * response's 'finish'), the list cache's read counter. The headers are
 * Fastify's, in its order. `http_cached_list_answers_total` counts the answers.
 * A hook added to the app later would never run for these answers:
 * test/cached-lists.test.ts pins the app's request hooks, so a new one fails it
 * until it is reproduced here (or makes the answer step aside). Hooks of an
 * encapsulating plugin are not seen either: list routes are registered in
 * fastify-plugin plugins (docs/architecture.md).
 */
export function registerCachedListAnswers (app: FastifyInstance, options: CachedListOptions): void {
  const { lifecycle, durations } = options
  /** By route path, which a list route's requests match exactly (no parameters, no query string). */
  const lists = new Map<string, { cached: () => ListBody | undefined }>()
  app.addHook('onRoute', function findCachedLists (route: RouteOptions) {
    const resource = (route.handler as ListRouteHandler)[LISTED]
    if (resource === undefined || route.method !== 'GET' || ROUTE_EXTRAS.some(extra => given(route[extra]))) return
    lists.set(route.url, resource)
  })
  let limits: AccessLimits | undefined
  app.addHook('onReady', function findLimits (done) {
    limits = app.hasDecorator('accessLimits') ? app.accessLimits : undefined
    done()
  })
  // Once app.close() begins, Fastify answers with Connection: close (and server.ts's shutdown sets lifecycle earlier still).
  let closing = false
  app.addHook('preClose', function stopAnswering (done) {
    closing = true
    done()
  })
  let answered = 0
  // eslint-disable-next-line no-new
  new Counter({ name: 'http_cached_list_answers_total', help: 'GETs of a cached list answered before Fastify (counted in http_request_duration_seconds too)', registers: [options.registry], collect () { this.reset(); this.inc(answered) } })
  const log = app.log as Logger

  function answer (req: IncomingMessage, res: ServerResponse): boolean {
    if (req.method !== 'GET') return false
    const route = req.url as string
    const list = lists.get(route)
    if (list === undefined) return false
    const start = performance.now()
    if (lifecycle.shuttingDown || closing || log.isLevelEnabled('debug')) return false
    if (rememberedKey(req) === undefined || limits?.mayRefuseVerified() === true) return false
    if (repeatedSingleton(req.rawHeaders) !== undefined) return false
    const hit = list.cached()
    if (hit === undefined) return false
    const id = requestId(req)
    let status: number
    // Headers as a flat [name, value, …] list: Node reads it by index, where an object's keys go through
    // its megamorphic keyed loads (bench:perf). The same headers, in the same order, as Fastify's answer.
    if (ifNoneMatchHits(req.headers['if-none-match'], hit.etag)) {
      status = 304
      res.writeHead(status, ['cache-control', 'no-cache', 'etag', hit.etag, 'x-request-id', id])
      res.end()
    } else {
      status = 200
      res.writeHead(status, ['cache-control', 'no-cache', 'etag', hit.etag, 'content-type', JSON_TYPE, 'x-request-id', id, 'content-length', String(hit.body.length)])
      res.end(hit.body)
    }
    answered++
    durations.observe('GET', route, status, (performance.now() - start) / 1000)
    return true
  }

  // Fastify's handler is the server's one 'request' listener (node:http adds createServer's listener there).
  // A host name that resolves to several addresses makes Fastify listen on more servers of its own, with its
  // handler alone: requests there are all Fastify's, the same answers, only slower.
  const server = app.server
  const [fastify, ...others] = server.listeners('request') as Array<(req: IncomingMessage, res: ServerResponse) => void>
  if (fastify === undefined || others.length > 0) throw new Error(`cached-lists.ts expected Fastify's handler as the server's one 'request' listener, found ${others.length + (fastify === undefined ? 0 : 1)}`)
  server.removeListener('request', fastify)
  server.on('request', function cachedListFirst (req: IncomingMessage, res: ServerResponse) {
    if (!answer(req, res)) fastify(req, res)
  })
}
