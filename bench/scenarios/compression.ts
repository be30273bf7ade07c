/*
 * compression: the list compressed once per version and coding. On COMPRESSION_ROWS rows (1,000,000) curl GETs the
 * list as it is, in gzip and in Brotli: the first GET of each coding (compressed then), the next (compressed already)
 * and the first after a create (a new version); bytes on the wire, times, the service's CPU, and what those bytes
 * take through a 100 Mbit/s link. Each compressed body is decoded here and compared with the identity body.
 * The CPU a compressed answer of a small list costs: the gzip and br scenarios of side-by-side.ts.
 */
import http from 'node:http'
import { promisify } from 'node:util'
import { brotliDecompress, gunzip } from 'node:zlib'
import { cpuSeconds } from '../proc-stats.js'
import type { ScenarioGroup } from '../report.js'
import {
  AUTH, LIST_PATH, type RunningServer, curlGet, log, metricTotal, numberFromEnv, seedLongRows, startServer
} from '../servers.js'

const ROWS = numberFromEnv('COMPRESSION_ROWS', 1_000_000)
const LINK_BITS_PER_SECOND = 100e6
const BITS_PER_BYTE = 8
const CODINGS = ['identity', 'gzip', 'br'] as const
type Coding = typeof CODINGS[number]
const COMPRESSED = ['gzip', 'br'] as const
const DECODE = { gzip: promisify(gunzip), br: promisify(brotliDecompress) }

const acceptFor = (coding: Coding): Record<string, string> => ({ 'accept-encoding': coding })
const megabytes = (bytes: number): string => `${(bytes / 1e6).toFixed(1)} MB`

/** A GET by node:http, which (unlike fetch) hands the body over as it came. */
async function rawGet (server: RunningServer, coding: Coding): Promise<{ body: Buffer, etag: string }> {
  return await new Promise((resolve, reject) => {
    http.get(`${server.url}${LIST_PATH}`, { headers: { ...AUTH, ...acceptFor(coding) } }, response => {
      const chunks: Buffer[] = []
      response.on('data', (chunk: Buffer) => chunks.push(chunk))
      response.on('error', reject)
      response.on('end', () => { resolve({ body: Buffer.concat(chunks), etag: response.headers.etag ?? '' }) })
    }).on('error', reject)
  })
}

/** Each compressed body decodes to the identity body, and its tag is the identity tag, weak, with its coding. */
async function checkDecoding (server: RunningServer): Promise<void> {
  const identity = await rawGet(server, 'identity')
  for (const coding of COMPRESSED) {
    const { body, etag } = await rawGet(server, coding)
    const decoded = await DECODE[coding](body)
    const matches = decoded.equals(identity.body) && etag === `W/${identity.etag.slice(0, -1)}-${coding}"`
    if (!matches) throw new Error(`the ${coding} body does not decode to the list, or its tag ${etag} is not`)
  }
}

export const compression: ScenarioGroup = {
  ids: ['compression'],
  byDefault: false,
  run: async ({ postgres, runId }) => {
    const databaseUrl = await postgres.createDatabase(`compression_${runId}`)
    const server = await startServer('service', { label: 'compression', workDir: postgres.workDir, databaseUrl })
    const lines: string[] = []
    let count = 0
    try {
      const bytes = await seedLongRows(databaseUrl, ROWS)
      lines.push(`${ROWS.toLocaleString('en')} rows, ${megabytes(bytes)} of JSON, curl on loopback (the body not ` +
        'decoded); the link time is the bytes at 100 Mbit/s', '',
      '| coding | GET | bytes | first byte | last byte | through 100 Mbit/s | service CPU |',
      '|---|---|---:|---:|---:|---:|---:|')
      const timed = async (coding: Coding, what: string): Promise<void> => {
        const before = cpuSeconds(server.pid)
        const t = await curlGet(`${server.url}${LIST_PATH}`, acceptFor(coding))
        if (t.status !== 200) throw new Error(`GET in ${coding} answered ${t.status}`)
        const link = `${(t.bytes * BITS_PER_BYTE / LINK_BITS_PER_SECOND).toFixed(1)} s`
        const cpu = `${(cpuSeconds(server.pid) - before).toFixed(2)} s`
        const times = `${t.firstByteMs.toFixed(0)} ms | ${t.totalMs.toFixed(0)} ms`
        lines.push(`| ${coding} | ${what} | ${megabytes(t.bytes)} | ${times} | ${link} | ${cpu} |`)
        log(`compression, ${coding} ${what}: ${megabytes(t.bytes)} in ${t.totalMs.toFixed(0)} ms`)
      }
      for (const coding of CODINGS) {
        await timed(coding, 'first of this coding')
        await timed(coding, 'next')
      }
      const headers = { ...AUTH, 'content-type': 'application/json' }
      const body = JSON.stringify({ name: `compression ${runId}` })
      const created = await fetch(`${server.url}${LIST_PATH}`, { method: 'POST', headers, body })
      if (created.status !== 201) throw new Error(`the create answered ${created.status}`)
      for (const coding of COMPRESSED) await timed(coding, 'first after a create')
      await checkDecoding(server)
      count = await metricTotal(server, 'categories_list_compressions_total')
    } finally {
      await server.stop()
    }
    lines.push('', 'Each compressed body decoded here to the identity body, under the identity tag made weak.')
    const target = 'each list version compressed once per coding'
    const measured = `${count} compressions, ${COMPRESSED.length} codings, two list versions`
    const verdict = { scenario: 'compression', target, measured, met: count === COMPRESSED.length * 2 }
    return [{ title: 'Compression', lines, verdicts: [verdict] }]
  }
}
