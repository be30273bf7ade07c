import { buildApp } from '../src/app.js'
import { loadConfig } from '../src/config.js'

/**
 * The OpenAPI document exactly as GET /docs/openapi.json serves it (its bytes). Builds
 * the real app without a database: the document needs none, and nothing connects before
 * a request (the change feed's attempts at an address where nothing listens fail
 * quietly until the app is closed).
 */
export async function servedOpenApi (): Promise<string> {
  const NO_DATABASE = 'postgres://openapi-export@127.0.0.1:1/none'
  const { DATABASE_DIRECT_URL: _direct, ...env } = process.env
  const config = loadConfig({
    ...env,
    DATABASE_URL: NO_DATABASE,
    API_KEYS: 'openapi-export',
    LOG_LEVEL: 'silent',
    METRICS_PORT: '0'
  })
  const app = await buildApp({ ...config, databaseUrl: NO_DATABASE })
  try {
    const res = await app.inject({ method: 'GET', url: '/docs/openapi.json' })
    if (res.statusCode !== 200) throw new Error(`GET /docs/openapi.json answered ${res.statusCode}: ${res.body}`)
    return res.body
  } finally {
    await app.close()
  }
}
