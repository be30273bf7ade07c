import type { FastifyReply } from 'fastify'
import type { ListEncoding } from '../machinery/list-compression.js'

const QVALUE = /^\s*q\s*=\s*(0(\.[0-9]{0,3})?|1(\.0{0,3})?)\s*$/i

/**
 * The coding to send for an Accept-Encoding header (RFC 9110 12.5.3), or undefined for identity. Ties go to
 * Brotli, then gzip, then identity; a member with a malformed q-value is ignored.
 */
export function negotiateEncoding (header: string | undefined): ListEncoding | undefined {
  if (header === undefined) return undefined
  const named = new Map<string, number>()
  for (const member of header.split(',')) {
    const [token = '', ...params] = member.split(';')
    let coding = token.trim().toLowerCase()
    if (coding === '') continue
    if (coding === 'x-gzip') coding = 'gzip'
    let quality = 1
    let malformed = false
    for (const param of params) {
      const match = QVALUE.exec(param)
      if (match === null) malformed = true
      else quality = Number(match[1])
    }
    if (!malformed) named.set(coding, Math.max(quality, named.get(coding) ?? 0))
  }
  const star = named.get('*')
  const quality = (coding: string): number => named.get(coding) ?? star ?? 0
  // Identity not named is acceptable but least preferred (as jshttp/negotiator ranks it): any coding asked for wins.
  const identity = named.get('identity') ?? 0
  let best: ListEncoding | undefined
  for (const coding of ['br', 'gzip'] as const) {
    if (quality(coding) > 0 && quality(coding) > (best === undefined ? 0 : quality(best))) best = coding
  }
  return best !== undefined && quality(best) >= identity ? best : undefined
}

/** Keeps what other parts of the app (CORS: Origin) put in Vary. */
export function addVary (reply: FastifyReply, field: string): void {
  const current = reply.getHeader('vary')
  const value = Array.isArray(current) ? current.join(', ') : current === undefined ? '' : String(current)
  if (value.split(',').some(name => name.trim().toLowerCase() === field.toLowerCase() || name.trim() === '*')) return
  reply.header('vary', value === '' ? field : `${value}, ${field}`)
}
