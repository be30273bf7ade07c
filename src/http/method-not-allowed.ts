import type { FastifyInstance } from 'fastify'
import { isProtectedPath } from './auth.js'
import { ApiError } from './errors.js'

interface KnownPath { url: string, pattern: RegExp, methods: string[] }

/** A route's URL as a pattern for request paths: each `:param` stands for one segment. */
function patternOf (url: string): RegExp {
  const parts = url.split(/(:[A-Za-z0-9_]+)/).map((part, i) => i % 2 === 1 ? '[^/]+' : part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'))
  return new RegExp(`^${parts.join('')}$`)
}

/**
 * A known path under /v1 with another method is 405 with Allow (not 404): the
 * routes' methods are collected as they are added, and a request that found no
 * route is checked against them in onRequest, after auth and before its body is read.
 */
export function registerMethodNotAllowed (app: FastifyInstance): void {
  const known: KnownPath[] = []
  app.addHook('onRoute', function collectMethods (route) {
    if (!isProtectedPath(route.url)) return
    let path = known.find(p => p.url === route.url)
    if (path === undefined) known.push(path = { url: route.url, pattern: patternOf(route.url), methods: [] })
    for (const method of [route.method].flat()) if (!path.methods.includes(method)) path.methods.push(method)
  })
  app.addHook('onRequest', function methodNotAllowed (request, _reply, done) {
    // Unrouted: no route at all, or only a catch-all such as @fastify/cors's OPTIONS *.
    const routed = isProtectedPath(request.routeOptions.url ?? '')
    const path = !routed ? known.find(p => p.pattern.test(request.url.split('?')[0] ?? '')) : undefined
    if (path === undefined) {
      done()
      return
    }
    // HEAD last: Fastify adds it for every GET route.
    const allow = [...path.methods.filter(m => m !== 'HEAD'), ...path.methods.filter(m => m === 'HEAD')].join(', ')
    done(new ApiError(405, 'METHOD_NOT_ALLOWED', `${request.method} is not allowed on ${path.url}; use ${allow}`, { allow }))
  })
}
