import { inspect } from 'node:util'

/** A start that cannot succeed: the message is the one line an operator reads, naming the setting to change. */
export class StartupError extends Error { override name = 'StartupError' }

/** One line to stderr; the details (the cause) only at LOG_LEVEL=debug or trace. */
export function reportStartupFailure (err: unknown, logLevel: string | undefined,
  write: (text: string) => void = text => { process.stderr.write(text) }): void {
  const debug = logLevel === 'debug' || logLevel === 'trace'
  const known = err instanceof StartupError
  const reason = err instanceof Error ? err.message : String(err)
  const line = (known ? reason : `the start failed unexpectedly: ${reason}`).replace(/\s*\n\s*/g, ' ')
  const hasDetails = !known || err.cause !== undefined
  write(`petstore: ${line}${hasDetails && !debug ? ' (LOG_LEVEL=debug shows the details)' : ''}\n`)
  if (debug && hasDetails) write(`${inspect(known ? err.cause : err, { depth: 6 })}\n`)
}
