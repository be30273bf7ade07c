import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { startEmbeddedPostgres } from '@petstore/embedded-postgres'

/**
 * Which PostgreSQL server the tests run on, and why; and starting/stopping it.
 * `npm test` (scripts/run-tests.ts) starts one per run and each test file makes its
 * own database on it (test/helpers/database.ts).
 *
 *   TEST_DATABASE=testcontainers   a container (TEST_POSTGRES_IMAGE); fail if no runtime answers
 *   TEST_DATABASE=embedded         the embedded PostgreSQL from node_modules
 *   DATABASE_URL=postgres://...    that server (databases are created on it and dropped)
 *   (none of these)                testcontainers when a container runtime answers, else embedded
 */
export type DatabaseSource = 'DATABASE_URL' | 'testcontainers' | 'embedded'

/** The image compose uses, so the tests run on what users run (Debian, glibc). */
export const DEFAULT_POSTGRES_IMAGE = 'postgres:18-bookworm'

export interface SourceChoice {
  source: DatabaseSource
  /** Why this source: printed once per run beside the source. */
  reason: string
  /** The server URL for DATABASE_URL, the image for testcontainers. */
  target?: string
}

/** Whether a container runtime answered, as far as the decision needs to know. */
export type RuntimeProbe = { answers: true; description: string } | { answers: false; error: string }

const requestable = ['testcontainers', 'embedded']

/** The decision, from the environment and (only when it matters) whether a container runtime answers. */
export async function decideSource (
  env: NodeJS.ProcessEnv,
  runtime: () => Promise<RuntimeProbe>
): Promise<SourceChoice> {
  const requested = env.TEST_DATABASE ?? ''
  const databaseUrl = env.DATABASE_URL ?? ''
  const image =
    env.TEST_POSTGRES_IMAGE !== undefined && env.TEST_POSTGRES_IMAGE !== ''
      ? env.TEST_POSTGRES_IMAGE
      : DEFAULT_POSTGRES_IMAGE
  if (requested !== '' && !requestable.includes(requested)) {
    throw new Error(`TEST_DATABASE must be one of ${requestable.join(', ')} (or unset), got "${requested}"`)
  }
  const ignored = databaseUrl !== '' ? ' (DATABASE_URL is ignored)' : ''
  if (requested === 'embedded') return { source: 'embedded', reason: `TEST_DATABASE=embedded${ignored}` }
  if (requested === '' && databaseUrl !== '') {
    return { source: 'DATABASE_URL', reason: 'DATABASE_URL is set', target: databaseUrl }
  }
  const probe = await runtime()
  if (requested === 'testcontainers') {
    if (!probe.answers) {
      throw new Error(`TEST_DATABASE=testcontainers, but no container runtime answers: ${probe.error}`)
    }
    return {
      source: 'testcontainers',
      reason: `TEST_DATABASE=testcontainers${ignored}; ${probe.description}`,
      target: image
    }
  }
  if (probe.answers) return { source: 'testcontainers', reason: probe.description, target: image }
  return {
    source: 'embedded',
    reason: `no container runtime answers (${probe.error}); TEST_DATABASE=testcontainers makes that an error`
  }
}

async function probeContainerRuntime (): Promise<RuntimeProbe> {
  const { getContainerRuntimeClient } = await import('testcontainers')
  try {
    const client = await getContainerRuntimeClient()
    const { containerRuntime } = client.info
    const address = containerRuntime.remoteSocketPath || containerRuntime.host
    const description = `a container runtime answers at ${address} (${containerRuntime.operatingSystem})`
    return { answers: true, description }
  } catch (err) {
    return { answers: false, error: firstLine(err) }
  }
}

export async function chooseSource (env: NodeJS.ProcessEnv = process.env): Promise<SourceChoice> {
  return await decideSource(env, probeContainerRuntime)
}

export function describeChoice (choice: SourceChoice): string {
  const what =
    choice.source === 'testcontainers'
      ? `testcontainers, image ${choice.target ?? DEFAULT_POSTGRES_IMAGE}`
      : choice.source === 'DATABASE_URL'
        ? `DATABASE_URL's server (${redact(choice.target ?? '')})`
        : 'the embedded PostgreSQL from node_modules'
  return `${what}: ${choice.reason}`
}

export interface PostgresServer {
  /** A superuser URL of the server's maintenance database; test databases are made from it. */
  url: string
  source: DatabaseSource
  /** Stops what was started (nothing for DATABASE_URL). */
  stop: () => Promise<void>
}

export async function startPostgresServer (choice: SourceChoice): Promise<PostgresServer> {
  if (choice.source === 'DATABASE_URL') {
    return { url: choice.target ?? '', source: 'DATABASE_URL', stop: async () => {} }
  }
  if (choice.source === 'testcontainers') return await startPostgresContainer(choice.target ?? DEFAULT_POSTGRES_IMAGE)
  const dir = await mkdtemp(path.join(tmpdir(), 'petstore-test-pg-'))
  const server = await startEmbeddedPostgres({ dir }).catch(async (err: unknown) => {
    await rm(dir, { recursive: true, force: true })
    throw err
  })
  return {
    url: server.url,
    source: 'embedded',
    stop: async () => {
      // destroy(): as root with a private TMPDIR the cluster lives outside `dir` (packages/embedded-postgres).
      await server.destroy()
      await rm(dir, { recursive: true, force: true })
    }
  }
}

/** Label on every container the tests start, so a leftover is easy to find (`docker ps -a --filter label=...`). */
export const CONTAINER_LABEL = 'org.petstore.test-database'

/** `entrypoint` replaces the image's (this helper's own test breaks the start with it). */
export async function startPostgresContainer (
  image: string,
  { entrypoint }: { entrypoint?: string[] } = {}
): Promise<PostgresServer> {
  const { PostgreSqlContainer } = await import('@testcontainers/postgresql')
  const { getContainerRuntimeClient, getReaper } = await import('testcontainers')
  const client = await getContainerRuntimeClient()
  try {
    await getReaper(client) // a no-op with TESTCONTAINERS_RYUK_DISABLED=true
  } catch (err) {
    throw new Error(
      'testcontainers could not start its reaper (Ryuk, which removes the containers of a run that dies): ' +
        `${firstLine(err)}. Where its image cannot be pulled, ` +
        'set TESTCONTAINERS_RYUK_DISABLED=true: the run stops its own containers',
      { cause: err }
    )
  }
  // testcontainers removes a container that started but never became ready; one that was
  // created and then failed to start (a port clash, a bad command) it leaves behind.
  class RecordedContainer extends PostgreSqlContainer {
    createdId: string | undefined
    protected override async containerCreated (id: string): Promise<void> {
      this.createdId = id
    }
  }
  const container = new RecordedContainer(image)
    .withLabels({ [CONTAINER_LABEL]: String(process.pid) })
    // Two test files at a time, each with several pools: the image's default 100 is tight.
    .withCommand(['postgres', '-c', 'max_connections=200'])
    // Not the library's default check (`sh -c pg_isready` every 250 ms, killed after 1 s): on a loaded machine the
    // engine killed the shell, its orphaned pg_isready became a child of the server (PID 1) and died of SIGPIPE, and
    // PostgreSQL restarted as after a crash ("untracked child process ... terminated by signal 13", then "the
    // database system is in recovery mode"). Without a shell nothing is orphaned; the longer timeout kills less.
    // pg_isready needs no user or database to tell whether the server accepts connections.
    .withHealthCheck({
      test: ['CMD', 'pg_isready', '--host', '127.0.0.1'],
      interval: 1000,
      timeout: 10_000,
      retries: 120
    })
  if (entrypoint !== undefined) container.withEntrypoint(entrypoint)
  try {
    const started = await container.start()
    const url = new URL(started.getConnectionUri())
    url.pathname = '/postgres'
    return {
      url: url.toString(),
      source: 'testcontainers',
      stop: async () => {
        await started.stop({ timeout: 0, removeVolumes: true })
      }
    }
  } catch (err) {
    if (container.createdId !== undefined) {
      await client.container
        .getById(container.createdId)
        .remove({ force: true, v: true })
        .catch(() => {})
    }
    throw new Error(`testcontainers could not start ${image}: ${firstLine(err)}`, { cause: err })
  }
}

function firstLine (err: unknown): string {
  return ((err instanceof Error ? err.message : String(err)).split('\n')[0] ?? '').trim()
}

function redact (url: string): string {
  try {
    const parsed = new URL(url)
    if (parsed.password !== '') parsed.password = '***'
    return parsed.toString()
  } catch {
    return '(not a URL)'
  }
}
