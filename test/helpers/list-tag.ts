import { createHash } from 'node:crypto'

/**
 * The strong tag of a list body (machinery/segmented-list.ts), computed here from its JSON: the SHA-1 of the SHA-1s
 * of its segments, each the rows whose ids share id / 4096, as JSON joined by commas. Rows are written back as
 * JSON.stringify writes them, which is what the service sends for these tests' rows.
 */
export function listTag (body: string): string {
  const segments = new Map<bigint, string[]>()
  for (const row of JSON.parse(body) as Array<{ id: number }>) {
    const key = BigInt(row.id) / 4096n
    segments.set(key, [...(segments.get(key) ?? []), JSON.stringify(row)])
  }
  const tag = createHash('sha1')
  for (const rows of segments.values()) tag.update(createHash('sha1').update(rows.join(',')).digest())
  return `"${tag.digest('base64url')}"`
}
