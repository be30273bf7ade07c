import type { IncomingMessage } from 'node:http'

const ABSOLUTE_FORM = /^https?:\/\/[^/?#]*/i
const UNRESERVED = /%(?:[46][1-9A-Fa-f]|[57][0-9Aa]|3[0-9]|2[DEde]|5[Ff]|7[Ee])/g

/**
 * Fastify's rewriteUrl: an absolute-form target becomes its path, and percent-encoded letters, digits and
 * `-._~` are decoded (RFC 3986 6.2.2.2), as the router decodes them: checks on the path see what routing sees.
 */
export function originForm (req: IncomingMessage): string {
  let target = req.url ?? ''
  const absolute = target.startsWith('/') ? null : ABSOLUTE_FORM.exec(target)
  if (absolute !== null) target = `/${target.slice(absolute[0].length).replace(/^\//, '')}`
  if (!target.includes('%')) return target
  const query = target.indexOf('?')
  const path = query === -1 ? target : target.slice(0, query)
  return path.replace(UNRESERVED, hex => String.fromCharCode(parseInt(hex.slice(1), 16))) + target.slice(path.length)
}
