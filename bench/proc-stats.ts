/*
 * Memory and CPU of processes, read from /proc (Linux). Peak RSS is the larger of VmHWM (reset through clear_refs
 * when the kernel allows it) and the highest VmRSS seen by polling, so a short spike between polls is not missed.
 */
import { readFileSync, readdirSync, writeFileSync } from 'node:fs'

const CLOCK_TICKS_PER_SECOND = 100
const RSS_POLL_MS = 50
/** /proc/<pid>/stat after the command's closing parenthesis: utime, stime, then cutime and cstime (reaped children). */
const UTIME_FIELD = 11
const STIME_FIELD = 12
const CUTIME_FIELD = 13
const CSTIME_FIELD = 14
/** clear_refs: 5 resets the peak RSS (VmHWM). */
const RESET_PEAK_RSS = '5'

function statusField (pid: number, field: 'VmRSS' | 'VmHWM'): number {
  const match = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return match === null ? 0 : Number(match[1]) * 1024
}

export function rssBytes (pid: number): number {
  try {
    return statusField(pid, 'VmRSS')
  } catch {
    return 0
  }
}

/** CPU seconds a process has used so far, in user space and in the kernel, and its reaped children in all. */
export function cpuSplit (pid: number): { user: number, system: number, children: number } {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    const seconds = (field: number): number => Number(fields[field]) / CLOCK_TICKS_PER_SECOND
    const children = seconds(CUTIME_FIELD) + seconds(CSTIME_FIELD)
    return { user: seconds(UTIME_FIELD), system: seconds(STIME_FIELD), children }
  } catch {
    return { user: 0, system: 0, children: 0 }
  }
}

export function cpuSeconds (pid: number): number {
  const { user, system } = cpuSplit(pid)
  return user + system
}

function parentPid (pid: string): number {
  const match = /^PPid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return match === null ? -1 : Number(match[1])
}

/**
 * CPU seconds used so far by a PostgreSQL server: its postmaster, the backends it runs and those it reaped (a pool
 * that reconnects takes no CPU with it); without a postmaster pid (DATABASE_URL), every `postgres` process running.
 */
export function postgresCpuSeconds (postmasterPid: number | undefined): number {
  let total = postmasterPid === undefined ? 0 : cpuSplit(postmasterPid).children
  for (const entry of readdirSync('/proc').filter(name => /^\d+$/.test(name))) {
    try {
      const ours = postmasterPid === undefined
        ? readFileSync(`/proc/${entry}/comm`, 'utf8').trim() === 'postgres'
        : Number(entry) === postmasterPid || parentPid(entry) === postmasterPid
      if (ours) total += cpuSeconds(Number(entry))
    } catch {
      // the process ended while we looked
    }
  }
  return total
}

/** CPU seconds the whole machine has spent busy (all CPUs, everything but idle and I/O wait). */
export function machineBusyCpuSeconds (): number {
  const fields = (readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '').trim().split(/\s+/).slice(1).map(Number)
  const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0, steal = 0] = fields
  return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS_PER_SECOND
}

/** Starts watching the peak RSS of `pid`; stop() returns it in bytes. */
export function watchPeakRss (pid: number): { stop: () => number } {
  let canReset = true
  try {
    writeFileSync(`/proc/${pid}/clear_refs`, RESET_PEAK_RSS)
  } catch {
    canReset = false
  }
  let peak = rssBytes(pid)
  const timer = setInterval(() => { peak = Math.max(peak, rssBytes(pid)) }, RSS_POLL_MS)
  return {
    stop: () => {
      clearInterval(timer)
      peak = Math.max(peak, rssBytes(pid))
      if (!canReset) return peak
      try {
        return Math.max(peak, statusField(pid, 'VmHWM'))
      } catch {
        return peak
      }
    }
  }
}
