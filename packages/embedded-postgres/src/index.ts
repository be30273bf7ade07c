export { isAlive, lockDataDir, ownerIsAlive, parseOwner, type DataDirLock } from './data-dir.js'
export { EmbeddedPostgresError } from './error.js'
export { freePort, ROOT_STATE_DIR, SERVICE_ROLE, startEmbeddedPostgres, type EmbeddedDatabase } from './postgres.js'
