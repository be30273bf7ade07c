import { StartupError } from './startup-error.js'

// Development tooling that the image does not install: loaded only when there is no DATABASE_URL.
export async function loadEmbedded () {
  const embedded = await import('@petstore/embedded-postgres').catch((err: unknown) => {
    throw new StartupError('DATABASE_URL is not set and the embedded PostgreSQL (@petstore/embedded-postgres, ' +
      'development tooling) is not installed here; run npm ci, or set DATABASE_URL', { cause: err })
  })
  // Its refusals are start failures: one line.
  const refused = (err: unknown): never => {
    throw err instanceof embedded.EmbeddedPostgresError ? new StartupError(err.message, { cause: err.cause }) : err
  }
  return { ...embedded, refused }
}
