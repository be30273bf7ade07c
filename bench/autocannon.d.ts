// autocannon ships no types; only what bench/load.ts uses.
declare module 'autocannon' {
  interface RequestData {
    method: string
    path: string
    headers: Record<string, string>
    body?: string | Buffer
  }
  interface Options {
    url: string
    connections?: number
    duration?: number
    overallRate?: number
    timeout?: number
    headers?: Record<string, string>
    requests?: Array<Partial<RequestData> & { setupRequest?: (req: RequestData) => RequestData }>
  }
  interface Histogram { average: number, mean: number, p50: number, p99: number, max: number, total: number }
  export interface Result {
    duration: number
    errors: number
    timeouts: number
    resets: number
    non2xx: number
    statusCodeStats: Record<string, { count: number }>
    latency: Histogram
    throughput: Histogram
    requests: Histogram & { sent: number }
  }
  interface Instance { stop: () => void }
  function autocannon (options: Options, callback: (err: Error | null, result: Result) => void): Instance
  export default autocannon
}
