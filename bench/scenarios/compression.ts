/*
 * compression: the list compressed once per version and coding. curl GETs the list as it is, in gzip and in Brotli:
 * the first GET of each coding (compressed then), the next (compressed already) and the first after a create.
 */
import { brotliDecompressSync, gunzipSync } from 'node:zlib'
import { cpuSeconds } from '../proc-stats.js'
import { type ScenarioGroup, header, row, verdict } from '../report.js'
import {
  LIST_PATH, curlBody, curlGet, log, metricTotal, numberFromEnv, seedLongRows, send, startServer
} from '../servers.js'

const ROWS = numberFromEnv('COMPRESSION_ROWS', 1_000_000)
const LINK_BITS_PER_SECOND = 100e6
const BITS_PER_BYTE = 8
const CODINGS = ['identity', 'gzip', 'br'] as const
const COMPRESSED = ['gzip', 'br'] as const
const DECODE = { gzip: gunzipSync, br: brotliDecompressSync }

const megabytes = (bytes: number): string => `${(bytes / 1e6).toFixed(1)} MB`

export const compression: ScenarioGroup = {
  ids: ['compression'],
  run: async (postgres) => {
    const databaseUrl = await postgres.createDatabase('compression')
    await seedLongRows(databaseUrl, ROWS)
    const server = await startServer('service', databaseUrl, { label: 'compression' })
    const list = `${server.url}${LIST_PATH}`
    const lines = [
      `${ROWS.toLocaleString('en')} rows, curl on loopback (the body not decoded); the link time is the bytes at ` +
        '100 Mbit/s',
      '',
      ...header(['coding', 'GET', 'bytes', 'first byte', 'last byte', 'through 100 Mbit/s', 'service CPU'])
    ]
    const timed = async (coding: string, what: string): Promise<void> => {
      const before = cpuSeconds(server.pid)
      const t = await curlGet(list, { 'accept-encoding': coding })
      if (t.status !== 200) throw new Error(`GET in ${coding} answered ${t.status}`)
      const link = `${(t.bytes * BITS_PER_BYTE / LINK_BITS_PER_SECOND).toFixed(1)} s`
      const cpu = `${(cpuSeconds(server.pid) - before).toFixed(2)} s`
      lines.push(row([coding, what, megabytes(t.bytes), `${t.firstByteMs.toFixed(0)} ms`, `${t.totalMs.toFixed(0)} ms`,
        link, cpu]))
      log(`compression, ${coding} ${what}: ${megabytes(t.bytes)} in ${t.totalMs.toFixed(0)} ms`)
    }
    let count = 0
    try {
      for (const coding of CODINGS) {
        await timed(coding, 'first of this coding')
        await timed(coding, 'next')
      }
      await send(list, 'POST', { name: 'compression' })
      for (const coding of COMPRESSED) await timed(coding, 'first after a create')
      // Each compressed body decodes to the identity body (test/ checks the tags).
      const identity = await curlBody(list, { 'accept-encoding': 'identity' })
      for (const coding of COMPRESSED) {
        const decoded = DECODE[coding](await curlBody(list, { 'accept-encoding': coding }))
        if (!decoded.equals(identity)) throw new Error(`${coding}: not the list`)
      }
      count = await metricTotal(server, 'categories_list_compressions_total')
    } finally {
      await server.stop()
    }
    const measured = `${count} compressions, ${COMPRESSED.length} codings, two list versions`
    const once = verdict('compression', 'each list version compressed once per coding', measured, count === 4)
    return { title: 'Compression', lines, verdicts: [once] }
  }
}
