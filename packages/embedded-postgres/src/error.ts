/** A start that cannot succeed: the message is the one line to show, naming what to change. */
export class EmbeddedPostgresError extends Error {
  constructor (message: string, options?: { cause?: unknown }) {
    super(message, options)
    this.name = 'EmbeddedPostgresError'
  }
}
