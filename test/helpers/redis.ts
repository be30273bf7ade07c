import { spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import { freePort } from './ports.js'

/**
 * A redis-server of the test's own (Debian's redis-server package; `npm run
 * test:redis` installs it), on a free loopback port, without persistence, in
 * a temporary directory. Never the machine's Redis on 6379.
 */
export interface TestRedis {
  url: string
  port: number
  /** SIGTERM, and wait until it has exited: the port refuses connections. */
  stop: () => Promise<void>
  /** Starts it again on the same port (empty: nothing was persisted). */
  start: () => Promise<void>
  /** SIGSTOP / SIGCONT: connections stay open but nothing answers (a hung or overloaded Redis). */
  pause: () => void
  resume: () => void
  /** A client of the test's own, for looking at keys. */
  client: () => Redis
}

interface Teardown {
  teardown: (fn: () => Promise<void> | void) => void
}

/** `port`: a fixed one (default: a free port), for a run given its own range. */
export async function testRedis (t: Teardown, options: { password?: string; port?: number } = {}): Promise<TestRedis> {
  if (spawnSync('redis-server', ['--version']).error !== undefined) {
    throw new Error("redis-server is not installed: run `npm run test:redis`, which installs it from Debian's packages")
  }
  const dir = await mkdtemp(path.join(tmpdir(), 'petstore-redis-'))
  const port = options.port ?? (await freePort())
  const auth = options.password === undefined ? '' : `:${encodeURIComponent(options.password)}@`
  let child: ChildProcess | undefined
  const clients: Redis[] = []

  const start = async (): Promise<void> => {
    const args = [
      '--port',
      String(port),
      '--bind',
      '127.0.0.1',
      '--save',
      '',
      '--appendonly',
      'no',
      '--dir',
      dir,
      ...(options.password === undefined ? [] : ['--requirepass', options.password])
    ]
    const started = spawn('redis-server', args, { stdio: ['ignore', 'pipe', 'inherit'] })
    child = started
    let output = ''
    started.stdout?.on('data', (chunk: Buffer) => {
      output += chunk.toString()
    })
    for (let i = 0; i < 100 && !output.includes('Ready to accept connections'); i++) {
      if (started.exitCode !== null) throw new Error(`redis-server exited: ${output}`)
      await sleep(50)
    }
    if (!output.includes('Ready to accept connections')) throw new Error(`redis-server did not start: ${output}`)
  }
  const stop = async (): Promise<void> => {
    const running = child
    child = undefined
    if (running === undefined || running.exitCode !== null) return
    running.kill('SIGCONT')
    running.kill('SIGTERM')
    await once(running, 'exit')
  }

  await start()
  t.teardown(async () => {
    for (const client of clients) client.disconnect()
    await stop()
    await rm(dir, { recursive: true, force: true })
  })
  return {
    url: `redis://${auth}127.0.0.1:${port}`,
    port,
    stop,
    start,
    pause: () => {
      child?.kill('SIGSTOP')
    },
    resume: () => {
      child?.kill('SIGCONT')
    },
    client: () => {
      const client = new Redis({
        port,
        host: '127.0.0.1',
        ...(options.password === undefined ? {} : { password: options.password })
      })
      clients.push(client)
      return client
    }
  }
}
