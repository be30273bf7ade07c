export { isAlive, lockDataDir, type DataDirLock } from './data-dir.js'
export { EmbeddedPostgresError } from './error.js'
export {
  freePort, ROOT_STATE_DIR, runningServiceUrl, SERVICE_ROLE, startEmbeddedPostgres, type EmbeddedDatabase
} from './postgres.js'
