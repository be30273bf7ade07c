import { inspect } from 'node:util'

/**
 * A start that cannot succeed. The message is the one line an operator reads: what
 * went wrong and which setting to change. The cause carries the details, shown
 * only at LOG_LEVEL=debug or trace.
 */
export class StartupError extends Error {
  constructor (message: string, options?: { cause?: unknown }) {
    super(message, options)
    this.name = 'StartupError'
  }
}

/** Writes a failed start to stderr: one line, then (at debug level) the details. */
export function reportStartupFailure (err: unknown, logLevel: string | undefined, write: (text: string) => void = text => { process.stderr.write(text) }): void {
  const debug = logLevel === 'debug' || logLevel === 'trace'
  const known = err instanceof StartupError
  const line = known ? err.message : `the start failed unexpectedly: ${err instanceof Error ? err.message : String(err)}`
  const hasDetails = !known || err.cause !== undefined
  write(`petstore: ${line.replace(/\s*\n\s*/g, ' ')}${hasDetails && !debug ? ' (LOG_LEVEL=debug shows the details)' : ''}\n`)
  if (debug && hasDetails) write(`${inspect(known ? err.cause : err, { depth: 6 })}\n`)
}
