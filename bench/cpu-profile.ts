/*
 * Reads a V8 .cpuprofile (node --cpu-prof) and tells where the CPU time of a
 * window went, per request: each sample is charged to the deepest frame of its
 * stack that belongs to a known part of the request path (a SHA-256 inside the
 * access hook is "SHA-256", the rest of the hook is the hook's), so the rows add
 * up to the busy time of the window.
 */

export interface CallFrame { functionName: string, url: string, lineNumber: number, columnNumber: number }
interface ProfileNode { id: number, callFrame: CallFrame, children?: number[] }
export interface CpuProfile { nodes: ProfileNode[], startTime: number, endTime: number, samples: number[], timeDeltas: number[] }

/** A part of the request path: a label and which frames belong to it. Earlier rules win when one frame matches several. */
interface Rule { label: string, matches: (frame: CallFrame) => boolean }

const inUrl = (...parts: string[]) => (f: CallFrame): boolean => parts.some(p => f.url.includes(p))
const named = (...names: string[]) => (f: CallFrame): boolean => names.includes(f.functionName)

export const RULES: Rule[] = [
  { label: 'idle (waiting for the network)', matches: named('(idle)') },
  { label: 'garbage collection', matches: named('(garbage collector)') },
  { label: 'V8 and native code not attributed to a JS frame', matches: named('(program)') },
  { label: 'SHA-256 of the API key (node:crypto)', matches: f => inUrl('internal/crypto/hash')(f) || named('timingSafeEqual')(f) },
  { label: 'request id (x-request-id, randomUUID)', matches: f => named('randomUUID', 'requestId', 'setRequestIdHeader')(f) || inUrl('internal/crypto/random')(f) },
  { label: 'access hook: key check (src/http/auth.ts)', matches: inUrl('/http/auth.', '@fastify/bearer-auth') },
  { label: 'access hook: rate limits (src/http/rate-limit.ts, @fastify/rate-limit)', matches: inUrl('/http/rate-limit.', '@fastify/rate-limit', 'toad-cache') },
  { label: 'HTTP/1.1 rules and the repeated-header check (src/http/protocol.ts)', matches: inUrl('/http/protocol.') },
  { label: 'POST body: JSON parse and I-JSON scan (src/http/json-body.ts, interoperable-json.ts)', matches: f => inUrl('/http/json-body.', '/http/interoperable-json.')(f) || (named('parse')(f) && f.url === '') },
  { label: 'POST body: schema validation (Ajv)', matches: f => f.functionName === 'validate' || inUrl('fastify/lib/validation.js', '/ajv/')(f) },
  { label: 'POST: group commit and its INSERT (src/machinery create-batcher, idempotency; src/categories repository)', matches: inUrl('/machinery/create-batcher.', '/machinery/idempotency.', '/categories/repository.') },
  { label: 'POST: pg client and protocol (pg, pg-protocol, src/db)', matches: inUrl('/node_modules/pg/', '/node_modules/pg-protocol/', '/node_modules/pg-pool/', '/node_modules/pg-types/', '/dist/db/') },
  { label: 'metrics: request histogram (src/http/metrics.ts, prom-client)', matches: inUrl('/http/metrics.', 'prom-client') },
  { label: 'per-request log decision and logging (pino)', matches: f => inUrl('/pino/', 'pino-std-serializers', 'abstract-logging', 'sonic-boom')(f) || named('logCompletion')(f) },
  { label: 'connection-close onSend hook (src/http/lifecycle.ts)', matches: inUrl('/http/lifecycle.') },
  { label: 'route handlers and list cache (src/categories, src/machinery, src/http/replies.ts)', matches: inUrl('/categories/', '/machinery/', '/http/replies.') },
  { label: 'other service code (dist/)', matches: inUrl('/dist/') },
  { label: 'Fastify routing (find-my-way)', matches: inUrl('find-my-way') },
  { label: 'Fastify hook runner (lib/hooks.js)', matches: inUrl('fastify/lib/hooks.js') },
  { label: 'Fastify reply and serialization (lib/reply.js)', matches: inUrl('fastify/lib/reply.js', 'fastify/lib/error-handler.js', 'fast-json-stringify') },
  { label: 'Fastify request setup and dispatch (fastify.js, route.js, handle-request.js, request.js, …)', matches: inUrl('/fastify/', 'avvio') },
  { label: 'bench raw server code', matches: inUrl('/bench/raw.') },
  { label: 'Node HTTP: parser, request and header objects', matches: inUrl('node:_http_server', 'node:_http_common', 'node:_http_incoming', 'node:internal/http') },
  { label: 'Node HTTP: response headers and socket writes', matches: inUrl('node:_http_outgoing', 'node:net', 'node:internal/stream_base_commons', 'node:internal/streams', 'node:stream') },
  { label: 'event loop: timers, nextTick, microtasks', matches: inUrl('node:internal/timers', 'node:internal/process/task_queues', 'node:timers', 'node:internal/async_hooks') },
  { label: 'Node events (EventEmitter)', matches: inUrl('node:events') }
]

/** What a frame is called in the function table: name, file and line. */
export function frameName (f: CallFrame): string {
  const file = f.url === '' ? '' : ` ${f.url.replace(/^file:\/\/.*?\/(node_modules|dist|bench|src)\//, '$1/')}:${f.lineNumber + 1}`
  return `${f.functionName === '' ? '(anonymous)' : f.functionName}${file}`
}

export interface WindowProfile {
  /** Microseconds of samples in the window, by label; idle included. */
  byLabel: Map<string, number>
  /** Microseconds of samples whose leaf is this frame (self time), by frame name. */
  bySelf: Map<string, number>
  /** Stacks (root;…;leaf) and their microseconds, for flame graph tools. */
  folded: Map<string, number>
  /** Microseconds of the window covered by samples. */
  sampled: number
}

/** The parts of the request path that the samples between `fromUs` and `toUs` (the profile's own clock) fell in. */
export function analyse (profile: CpuProfile, fromUs: number, toUs: number): WindowProfile {
  const byId = new Map(profile.nodes.map(n => [n.id, n]))
  const parent = new Map<number, number>()
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id)
  const labelOf = new Map<number, string>()
  const stackOf = new Map<number, string>()
  const label = (id: number): string => {
    const known = labelOf.get(id)
    if (known !== undefined) return known
    // The deepest frame that a rule names; without one, the leaf's file (or its name, for native frames).
    let found: string | undefined
    const frames: CallFrame[] = []
    for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) frames.push((byId.get(at) as ProfileNode).callFrame)
    for (const frame of frames) {
      found = RULES.find(r => r.matches(frame))?.label
      if (found !== undefined) break
    }
    const leaf = frames[0] as CallFrame
    const result = found ?? `other: ${leaf.url === '' ? leaf.functionName : leaf.url.replace(/^file:\/\/.*?\/node_modules\//, '').replace(/^file:\/\/.*?\/(dist|bench)\//, '$1/')}`
    labelOf.set(id, result)
    stackOf.set(id, frames.reverse().map(f => f.functionName === '' ? '(anonymous)' : f.functionName).join(';'))
    return result
  }
  const byLabel = new Map<string, number>()
  const bySelf = new Map<string, number>()
  const folded = new Map<string, number>()
  let sampled = 0
  let t = profile.startTime
  for (let i = 0; i < profile.samples.length; i++) {
    t += profile.timeDeltas[i] ?? 0
    if (t < fromUs || t > toUs) continue
    // A sample stands for the time until the next one.
    const span = profile.timeDeltas[i + 1] ?? 0
    const id = profile.samples[i] as number
    const l = label(id)
    byLabel.set(l, (byLabel.get(l) ?? 0) + span)
    const self = frameName((byId.get(id) as ProfileNode).callFrame)
    bySelf.set(self, (bySelf.get(self) ?? 0) + span)
    const stack = stackOf.get(id) as string
    folded.set(stack, (folded.get(stack) ?? 0) + span)
    sampled += span
  }
  return { byLabel, bySelf, folded, sampled }
}

/** A markdown table of µs per request by part of the request path (busy time only), and the top self-time functions. */
export function perRequestTable (w: WindowProfile, requests: number, topFunctions = 25): string {
  const idle = w.byLabel.get(RULES[0]?.label ?? '') ?? 0
  const busy = w.sampled - idle
  const us = (v: number): string => (v / requests).toFixed(2)
  const pct = (v: number): string => `${(v / busy * 100).toFixed(1)}%`
  const rows = [...w.byLabel].filter(([l]) => l !== RULES[0]?.label).sort((a, b) => b[1] - a[1])
  const lines = [
    `${requests} requests; busy ${(busy / 1e6).toFixed(2)} s of ${(w.sampled / 1e6).toFixed(2)} s sampled: **${us(busy)} µs of CPU per request**`,
    '',
    '| part of the request path | µs/request | share of busy |',
    '|---|---:|---:|',
    ...rows.map(([l, v]) => `| ${l} | ${us(v)} | ${pct(v)} |`),
    '',
    '| function (self time) | µs/request | share of busy |',
    '|---|---:|---:|',
    ...[...w.bySelf].filter(([f]) => !f.startsWith('(idle)')).sort((a, b) => b[1] - a[1]).slice(0, topFunctions).map(([f, v]) => `| ${f.replace(/\|/g, '\\|')} | ${us(v)} | ${pct(v)} |`)
  ]
  return lines.join('\n')
}
