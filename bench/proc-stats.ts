/*
 * Memory and CPU of processes, read from /proc (Linux). Peak RSS is the larger
 * of VmHWM (reset through clear_refs when the kernel allows it) and the highest
 * VmRSS seen by polling, so a short spike between polls is not missed.
 */
import { readFileSync, readdirSync, writeFileSync } from 'node:fs'

const CLOCK_TICKS_PER_SECOND = 100

function statusField (pid: number, field: 'VmRSS' | 'VmHWM'): number {
  const match = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return match === null ? 0 : Number(match[1]) * 1024
}

export function rssBytes (pid: number): number {
  try { return statusField(pid, 'VmRSS') } catch { return 0 }
}

/** CPU seconds (user + system) the process has used so far. */
export function cpuSeconds (pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS_PER_SECOND
  } catch {
    return 0
  }
}

function parentPid (pid: string): number {
  const match = /^PPid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return match === null ? -1 : Number(match[1])
}

/**
 * CPU seconds used so far by a PostgreSQL server: its postmaster and the
 * processes it forked. Without a postmaster pid (a DATABASE_URL server), every
 * process named `postgres` on the machine.
 */
export function postgresCpuSeconds (postmasterPid?: number): number {
  let total = 0
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue
    try {
      const ours = postmasterPid === undefined
        ? readFileSync(`/proc/${entry}/comm`, 'utf8').trim() === 'postgres'
        : Number(entry) === postmasterPid || parentPid(entry) === postmasterPid
      if (ours) total += cpuSeconds(Number(entry))
    } catch { /* the process ended while we looked */ }
  }
  return total
}

/** CPU seconds the whole machine has spent busy (all CPUs, everything but idle and I/O wait). */
export function machineBusyCpuSeconds (): number {
  const fields = (readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '').trim().split(/\s+/).slice(1).map(Number)
  const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0, steal = 0] = fields
  return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS_PER_SECOND
}

export interface PeakRss { stop: () => number }

/** Starts watching the peak RSS of `pid`; stop() returns it in bytes. */
export function watchPeakRss (pid: number, intervalMs = 50): PeakRss {
  let canReset = true
  try { writeFileSync(`/proc/${pid}/clear_refs`, '5') } catch { canReset = false }
  let peak = rssBytes(pid)
  const timer = setInterval(() => { peak = Math.max(peak, rssBytes(pid)) }, intervalMs)
  return {
    stop: () => {
      clearInterval(timer)
      peak = Math.max(peak, rssBytes(pid))
      if (canReset) {
        try { peak = Math.max(peak, statusField(pid, 'VmHWM')) } catch { /* the process is gone */ }
      }
      return peak
    }
  }
}
