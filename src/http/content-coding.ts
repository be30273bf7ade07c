import type { ListEncoding } from '../machinery/list-compression.js'

const QVALUE = /^\s*q\s*=\s*(0(\.[0-9]{0,3})?|1(\.0{0,3})?)\s*$/i

// The coding to send for an Accept-Encoding header (RFC 9110 12.5.3), or undefined for identity. Ties go to Brotli,
// then gzip, then identity; a member with a malformed q-value is ignored.
export function negotiateEncoding (header: string | undefined): ListEncoding | undefined {
  const named = new Map<string, number>()
  for (const member of header?.split(',') ?? []) {
    const [token = '', ...params] = member.split(';')
    const coding = token.trim().toLowerCase().replace(/^x-gzip$/, 'gzip')
    if (coding === '') continue
    const qualities = params.map(param => QVALUE.exec(param)?.[1])
    if (qualities.includes(undefined)) continue
    named.set(coding, Math.max(Number(qualities.at(-1) ?? 1), named.get(coding) ?? 0))
  }
  const star = named.get('*')
  const quality = (coding: string): number => named.get(coding) ?? star ?? 0
  // Identity not named is acceptable but least preferred (as jshttp/negotiator ranks it): any coding asked for wins.
  const identity = named.get('identity') ?? 0
  const best = quality('br') >= quality('gzip') ? 'br' : 'gzip'
  return quality(best) > 0 && quality(best) >= identity ? best : undefined
}
