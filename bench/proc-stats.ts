/* Memory and CPU of processes, read from /proc (Linux). */
import { readFileSync, readdirSync, writeFileSync } from 'node:fs'

const CLOCK_TICKS_PER_SECOND = 100
/** /proc/<pid>/stat after the command's closing parenthesis: utime, stime, then cutime and cstime (reaped children). */
const UTIME_FIELD = 11
const STIME_FIELD = 12
const CUTIME_FIELD = 13
const CSTIME_FIELD = 14

const BYTES_PER_KB = 1024
/** clear_refs: 5 resets the peak RSS (VmHWM). */
const RESET_PEAK_RSS = '5'

function procFile (pid: number, name: string): string {
  try {
    return readFileSync(`/proc/${pid}/${name}`, 'utf8')
  } catch {
    return ''
  }
}

const statusNumber = (pid: number, field: string): number =>
  Number(new RegExp(`^${field}:\\s+(\\d+)`, 'm').exec(procFile(pid, 'status'))?.[1] ?? 0)

export const rssBytes = (pid: number): number => statusNumber(pid, 'VmRSS') * BYTES_PER_KB
/** The highest RSS the process has had since resetPeakRss, or since it started where the kernel refused the reset. */
export const peakRssBytes = (pid: number): number => statusNumber(pid, 'VmHWM') * BYTES_PER_KB

export function resetPeakRss (pid: number): void {
  try {
    writeFileSync(`/proc/${pid}/clear_refs`, RESET_PEAK_RSS)
  } catch {
    // not allowed here: the peak counts from the start
  }
}

export function cpuSplit (pid: number): { user: number, system: number, children: number } {
  const stat = procFile(pid, 'stat')
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  const seconds = (field: number): number => Number(fields[field] ?? 0) / CLOCK_TICKS_PER_SECOND
  const children = seconds(CUTIME_FIELD) + seconds(CSTIME_FIELD)
  return { user: seconds(UTIME_FIELD), system: seconds(STIME_FIELD), children }
}

export function cpuSeconds (pid: number): number {
  const { user, system } = cpuSplit(pid)
  return user + system
}

/** CPU seconds used so far by PostgreSQL: the postmaster, its backends and those it reaped (a pool reconnects). */
export function postgresCpuSeconds (postmasterPid: number): number {
  let total = cpuSplit(postmasterPid).children
  for (const pid of readdirSync('/proc').filter(name => /^\d+$/.test(name)).map(Number)) {
    if (pid === postmasterPid || statusNumber(pid, 'PPid') === postmasterPid) total += cpuSeconds(pid)
  }
  return total
}

/** CPU seconds the whole machine has spent busy (all CPUs, everything but idle and I/O wait). */
export function machineBusyCpuSeconds (): number {
  const fields = (readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '').trim().split(/\s+/).slice(1).map(Number)
  const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0, steal = 0] = fields
  return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS_PER_SECOND
}
