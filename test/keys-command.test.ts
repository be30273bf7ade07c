import { execFile, spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { promisify } from 'node:util'
import t from 'tap'
import { runMigrations } from '../src/db/migrate.js'
import { testApp } from './helpers/app.js'
import { testDatabase } from './helpers/database.js'
import { withClient } from './helpers/pg-client.js'

/* `npm run keys` as a real process (src/keys/command.ts through tsx, as dist/keys/command.js runs it), on the service's database. */

t.setTimeout(240000)
const db = await testDatabase(t)
await runMigrations(db.url, { info: () => {}, warn: () => {}, error: () => {} })
const run = promisify(execFile)

interface Outcome { code: number, stdout: string, stderr: string }

async function keys (args: string[], env: Record<string, string> = { DATABASE_URL: db.url }): Promise<Outcome> {
  const child = run(process.execPath, ['--import', 'tsx', 'src/keys/command.ts', ...args],
    { env: { PATH: process.env.PATH, HOME: process.env.HOME, ...env }, timeout: 60000 })
  return await child.then(({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
    (err: { code: number, stdout: string, stderr: string }) => ({ code: err.code, stdout: err.stdout, stderr: err.stderr }))
}

t.test('create prints the key alone on its last line; list never shows it; revoke takes it away', async t => {
  const created = await keys(['create', '--name', 'ci deploy', '--scope', 'read', '--expires-in', '30', '--rate-limit', '100'])
  t.equal(created.code, 0, created.stderr)
  const key = created.stdout.trimEnd().split('\n').at(-1) ?? ''
  t.match(key, /^petstore_[0-9A-Za-z]{36}$/)
  const [row] = await withClient(db.url, async c => (await c.query(
    "SELECT name, scope, rate_limit_per_minute, expires_at > now() + interval '29 days' AS expires, encode(digest, 'hex') AS digest FROM api_keys")).rows)
  t.match(row, { name: 'ci deploy', scope: 'read', rate_limit_per_minute: 100, expires: true })

  const { app } = await testApp(t, db.url)
  t.equal((await app.inject({ url: '/v1/categories', headers: { authorization: `Bearer ${key}` } })).statusCode, 200)

  const listed = await keys(['list', '--json'])
  t.equal(listed.code, 0, listed.stderr)
  const all = JSON.parse(listed.stdout) as Array<{ id: number, name: string, prefix: string, revokedAt: string | null }>
  t.match(all, [{ name: 'ci deploy', scope: 'read', prefix: key.slice(0, 13), revokedAt: null }])
  t.notOk(listed.stdout.includes(key) || listed.stdout.includes(String(row?.digest)), 'neither the key nor its digest')
  const text = await keys(['list'])
  t.match(text.stdout, /ci deploy/)
  t.notOk(text.stdout.includes(key))

  const id = String(all[0]?.id)
  const revoked = await keys(['revoke', id])
  t.equal(revoked.code, 0, revoked.stderr)
  t.match(revoked.stdout, `key ${id} revoked at `)
  await app.apiKeys.reload()
  t.equal((await app.inject({ url: '/v1/categories', headers: { authorization: `Bearer ${key}` } })).statusCode, 401)
  t.match((await keys(['list', '--json'])).stdout, /"revokedAt": "\d{4}-/)
})

t.test('failures: one line naming what to fix, exit 1, no stack trace', async t => {
  const cases: Array<[string[], RegExp, Record<string, string>?]> = [
    [[], /^keys: usage: keys create --name NAME/],
    [['create', '--scope', 'read'], /^keys: --name must be given/],
    [['create', '--name', 'x', '--scope', 'admin'], /^keys: --scope must be read or write/],
    [['create', '--name', 'x', '--scope', 'read', '--expires-in', '0'], /^keys: --expires-in must be a positive number/],
    [['create', '--name', 'x', '--scope', 'read', '--rate-limit', '1.5'], /^keys: --rate-limit must be a positive whole number/],
    [['list', '--bogus'], /^keys: Unknown option '--bogus'/],
    [['revoke'], /^keys: revoke needs the key's id/],
    [['revoke', '999'], /^keys: no API key with id 999/],
    [['list'], /^keys: DATABASE_URL: connection refused by 127\.0\.0\.1:1;/, { DATABASE_URL: 'postgres://u:secret@127.0.0.1:1/db' }]
  ]
  for (const [args, message, env] of cases) {
    const { code, stdout, stderr } = await keys(args, env)
    t.equal(code, 1, args.join(' '))
    t.match(stderr, message)
    t.equal(stderr.trimEnd().split('\n').length, 1, `one line: ${stderr}`)
    t.notMatch(stderr, /\bat .*:\d+:\d+|secret/, 'no stack trace, no password')
    t.equal(stdout, '')
  }
})

/**
 * Bound on the time from a command's answer to its exit, through the embedded PostgreSQL's fast shutdown (about a
 * second, a few on a busy machine). The embedded server's stop once left its 30 s stop timeout pending, which kept
 * every command alive 30 s after its answer: the bound sits well clear of both.
 */
const EXIT_AFTER_ANSWER_MS = 15000

/** The command with no DATABASE_URL; whether it exited within EXIT_AFTER_ANSWER_MS of its first output on stdout. */
async function keysEmbedded (args: string[], dataDir: string): Promise<Outcome & { exitedInTime: boolean }> {
  const env = { PATH: process.env.PATH, HOME: process.env.HOME, DATA_DIR: dataDir }
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/keys/command.ts', ...args], { env })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk: Buffer) => { stdout += chunk.toString() })
  child.stderr.on('data', (chunk: Buffer) => { stderr += chunk.toString() })
  const exited = once(child, 'exit')
  const closed = once(child, 'close')
  await Promise.race([once(child.stdout, 'data'), exited])
  const bound = new AbortController()
  const overdue = sleep(EXIT_AFTER_ANSWER_MS, false, { signal: bound.signal }).catch(() => false)
  const exitedInTime = await Promise.race([exited.then(() => true), overdue])
  bound.abort()
  const [code] = await closed as [number]
  return { code, stdout, stderr, exitedInTime }
}

t.test('with the embedded PostgreSQL (no DATABASE_URL), each command exits as soon as it has answered', async t => {
  const dir = await mkdtemp(path.join(tmpdir(), 'petstore-keys-'))
  t.teardown(async () => { await rm(dir, { recursive: true, force: true }) })
  const created = await keysEmbedded(['create', '--name', 'embedded', '--scope', 'read'], dir)
  t.equal(created.code, 0, created.stderr)
  t.ok(created.exitedInTime, `create exited within ${EXIT_AFTER_ANSWER_MS} ms of its answer`)
  const listed = await keysEmbedded(['list', '--json'], dir)
  t.equal(listed.code, 0, listed.stderr)
  t.ok(listed.exitedInTime, `list exited within ${EXIT_AFTER_ANSWER_MS} ms of its answer`)
  const [key] = JSON.parse(listed.stdout) as Array<{ id: number, name: string }>
  t.equal(key?.name, 'embedded')
  const revoked = await keysEmbedded(['revoke', String(key?.id)], dir)
  t.equal(revoked.code, 0, revoked.stderr)
  t.ok(revoked.exitedInTime, `revoke exited within ${EXIT_AFTER_ANSWER_MS} ms of its answer`)
})
