/**
 * freePort: a loopback port that was free a moment ago (nothing listens there now), for tests' own
 * servers, proxies and addresses nobody answers. The embedded PostgreSQL picks its port the same way.
 */
export { freePort } from '../../src/db/embedded.js'
