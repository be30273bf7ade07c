import { execFile, spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { promisify } from 'node:util'
import t from 'tap'
import { runMigrations } from '../src/db/migrate.js'
import { HELP, parse } from '../src/keys/arguments.js'
import { testApp } from './helpers/app.js'
import { builtCheckout } from './helpers/built-checkout.js'
import { testDatabase } from './helpers/database.js'
import { withClient } from './helpers/pg-client.js'
import { untracked } from './helpers/untracked.js'

/*
 * `npm run keys` as a real process (the run's build: dist/keys/command.js, as npm run keys runs it), on the
 * service's database; the rules for its arguments (src/keys/arguments.ts) in this process.
 */

t.setTimeout(240000)
const db = await testDatabase(t)
await runMigrations(db.url, { info: () => {}, warn: () => {}, error: () => {} })
const run = promisify(execFile)
const command = path.join(await builtCheckout(t), 'dist', 'keys', 'command.js')
/** The command's environment: none of the test's own. */
const BASE_ENV = { PATH: process.env.PATH, HOME: process.env.HOME }

interface Outcome {
  code: number
  stdout: string
  stderr: string
}
/** Not the service's: any connection there is refused, so a command that tried to connect would say so. */
const NO_DATABASE = { DATABASE_URL: 'postgres://u@127.0.0.1:1/db' }

async function keys (args: string[], env: Record<string, string> = { DATABASE_URL: db.url }): Promise<Outcome> {
  const options = { env: { ...BASE_ENV, ...env }, timeout: 60000 }
  const child = run(...untracked(process.execPath, [command, ...args]), options)
  return await child.then(
    ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
    (err: { code: number; stdout: string; stderr: string }) => ({
      code: err.code,
      stdout: err.stdout,
      stderr: err.stderr
    })
  )
}

t.test('create prints the key alone on its last line; list never shows it; revoke takes it away', async t => {
  const created = await keys([
    'create',
    '--name',
    'ci deploy',
    '--scope',
    'read',
    '--expires-in',
    '30',
    '--rate-limit',
    '100'
  ])
  t.equal(created.code, 0, created.stderr)
  const key = created.stdout.trimEnd().split('\n').at(-1) ?? ''
  t.match(key, /^petstore_[0-9A-Za-z]{36}$/)
  const [row] = await withClient(
    db.url,
    async c =>
      (
        await c.query(`SELECT name, scope, rate_limit_per_minute, expires_at > now() + interval '29 days' AS expires,
          encode(digest, 'hex') AS digest FROM api_keys`)
      ).rows
  )
  t.match(row, { name: 'ci deploy', scope: 'read', rate_limit_per_minute: 100, expires: true })

  const { app } = await testApp(t, db.url)
  t.equal((await app.inject({ url: '/v1/categories', headers: { authorization: `Bearer ${key}` } })).statusCode, 200)

  const listed = await keys(['list', '--json'])
  t.equal(listed.code, 0, listed.stderr)
  const all = JSON.parse(listed.stdout) as Array<{ id: number; name: string; prefix: string; revokedAt: string | null }>
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

t.test('every argument is checked before anything starts: a refusal names the option', async t => {
  const create = ['create', '--name', 'x', '--scope', 'read']
  const refused: Array<[string[], RegExp]> = [
    [[], /^usage: keys create --name NAME/],
    [['lsit'], /^unknown command 'lsit'; usage: /],
    [['create', '--scope', 'read'], /^--name must be given/],
    [['create', '--name', 'a\tb', '--scope', 'read'], /^--name must .*no control characters/],
    [['create', '--name', 'x'.repeat(256), '--scope', 'read'], /^--name must be given, 1 to 255 characters/],
    [['create', '--name', 'x', '--scope', 'admin'], /^--scope must be read or write/],
    [[...create, '--expires-in', '0'], /^--expires-in must be a number of days above 0, at most 36500$/],
    [[...create, '--expires-in', '36500.5'], /^--expires-in must be/],
    [[...create, '--expires-in', '0x10'], /^--expires-in must be/],
    [[...create, '--expires-in', '1e3'], /^--expires-in must be/],
    [[...create, '--rate-limit', '0'], /^--rate-limit must be a whole number from 1 to 2147483647$/],
    [[...create, '--rate-limit', '1.5'], /^--rate-limit must be/],
    [[...create, '--rate-limit', '2147483648'], /^--rate-limit must be/],
    [[...create, '--name', 'y'], /^--name is given twice; give each option once$/],
    [['list', '--json', '--json'], /^--json is given twice/],
    [['list', '--name', 'x'], /^list takes no --name; usage: /],
    [['list', 'all'], /^list takes no argument 'all'; usage: /],
    [['list', '--name'], /^Option '--name <value>' argument missing; usage: /],
    [['revoke'], /^revoke needs the key's id/],
    [['revoke', 'seven'], /^revoke needs the key's id/],
    [['revoke', '1', '2'], /^revoke takes no argument '2'; usage: /]
  ]
  for (const [args, message] of refused) t.throws(() => parse(args), { name: 'StartupError', message }, args.join(' '))

  const bounds = { name: 'x', scope: 'read', expiresInDays: 36500, ratePerMinute: 2147483647 }
  t.same(parse([...create, '--expires-in', '36500', '--rate-limit', '2147483647']), { command: 'create', key: bounds })
  t.same(parse(['create', '--name', ' ci ', '--scope', 'write', '--expires-in', '0.5']), {
    command: 'create',
    key: { name: 'ci', scope: 'write', expiresInDays: 0.5, ratePerMinute: null }
  })
  t.same(parse(['list', '--json']), { command: 'list', json: true })
  t.same(parse(['revoke', '7']), { command: 'revoke', id: '7' })
  for (const args of [['--help'], ['-h'], ['help'], ['create', '--name', 'x', '--help']]) {
    t.same(parse(args), { command: 'help' }, args.join(' '))
  }
})

t.test('--help prints the usage on stdout and exits 0', async t => {
  const { code, stdout, stderr } = await keys(['--help'], NO_DATABASE)
  t.equal(code, 0, stderr)
  t.equal(stdout, HELP)
  t.match(stdout, /^usage: keys create --name NAME --scope read\|write .*\n +keys list \[--json\]\n/)
  t.equal(stderr, '')
})

t.test('failures: one line naming what to fix, exit 1, no stack trace, and nothing written', async t => {
  const cases: Array<[string[], RegExp, Record<string, string>?]> = [
    [[], /^keys: usage: keys create --name NAME/],
    [['create', '--name', 'x', '--scope', 'read', '--expires-in', '99999999'], /^keys: --expires-in must be a number/],
    [['create', '--name', 'x', '--scope', 'read', '--scope', 'write'], /^keys: --scope is given twice/],
    [['list', '--bogus'], /^keys: Unknown option '--bogus'.*; usage: keys create --name NAME/],
    [['revoke', '999'], /^keys: no API key with id 999/],
    [
      ['list'],
      /^keys: DATABASE_URL: connection refused by 127\.0\.0\.1:1;/,
      { DATABASE_URL: 'postgres://u:secret@127.0.0.1:1/db' }
    ]
  ]
  const count = async (): Promise<unknown> =>
    await withClient(db.url, async c => (await c.query('SELECT count(*)::int AS n FROM api_keys')).rows[0])
  const before = await count()
  for (const [args, message, env] of cases) {
    const { code, stdout, stderr } = await keys(args, env)
    t.equal(code, 1, args.join(' '))
    t.match(stderr, message)
    t.equal(stderr.trimEnd().split('\n').length, 1, `one line: ${stderr}`)
    t.notMatch(stderr, /\bat .*:\d+:\d+|secret/, 'no stack trace, no password')
    t.equal(stdout, '')
  }
  t.same(await count(), before, 'no key written by a refused command')
})

t.test('a key stored with an expiry past what a Date holds (an older command wrote one) is listed', async t => {
  // 99999999 days from now is past +275760-09-13, the last day a Date can hold; PostgreSQL holds it.
  await withClient(
    db.url,
    async c =>
      await c.query(`
    INSERT INTO api_keys (name, scope, prefix, digest, expires_at) VALUES
      ('far future', 'read', 'petstore_abcd', decode(repeat('ab', 32), 'hex'), now() + 99999999 * interval '1 day')`)
  )
  const text = await keys(['list'])
  t.equal(text.code, 0, text.stderr)
  t.match(text.stdout, /far future .* \d{6}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z/, 'its year written out')
  const json = await keys(['list', '--json'])
  t.equal(json.code, 0, json.stderr)
  const listed = JSON.parse(json.stdout) as Array<{ name: string; createdAt: string; expiresAt: string | null }>
  const far = listed.find(key => key.name === 'far future')
  t.match(far?.expiresAt, /^\d{6}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/, 'an expiry, not null ("never")')
  t.equal(new Date(far?.createdAt ?? '').toISOString(), far?.createdAt, 'other times as toISOString writes them')
})

t.test('list into a reader that stops early (keys list | head): exit 0, nothing on stderr', async t => {
  // Far more than a pipe's buffer (64 KiB), so that the command is still writing when the reader goes.
  await withClient(
    db.url,
    async c =>
      await c.query(`INSERT INTO api_keys (name, scope, prefix, digest)
    SELECT 'bulk ' || n, 'read', 'petstore_bulk', sha256(n::text::bytea) FROM generate_series(1, 3000) n`)
  )
  t.teardown(async () => {
    await withClient(db.url, async c => await c.query("DELETE FROM api_keys WHERE name LIKE 'bulk %'"))
  })
  const child = spawn(...untracked(process.execPath, [command, 'list']), { env: { ...BASE_ENV, DATABASE_URL: db.url } })
  let stderr = ''
  child.stderr.on('data', (chunk: Buffer) => {
    stderr += chunk.toString()
  })
  const closed = once(child, 'close')
  await once(child.stdout, 'data')
  child.stdout.destroy()
  const [code] = (await closed) as [number]
  t.equal(code, 0, stderr)
  t.equal(stderr, '')
})

/**
 * Bound on the time from a command's answer to its exit, through the embedded PostgreSQL's fast shutdown (about a
 * second, a few on a busy machine). The embedded server's stop once left its 30 s stop timeout pending, which kept
 * every command alive 30 s after its answer: the bound sits well clear of both.
 */
const EXIT_AFTER_ANSWER_MS = 15000

/** The command with no DATABASE_URL; whether it exited within EXIT_AFTER_ANSWER_MS of its first output on stdout. */
async function keysEmbedded (args: string[], dataDir: string): Promise<Outcome & { exitedInTime: boolean }> {
  const env = { ...BASE_ENV, DATA_DIR: dataDir }
  const child = spawn(...untracked(process.execPath, [command, ...args]), { env })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk: Buffer) => {
    stdout += chunk.toString()
  })
  child.stderr.on('data', (chunk: Buffer) => {
    stderr += chunk.toString()
  })
  const exited = once(child, 'exit')
  const closed = once(child, 'close')
  await Promise.race([once(child.stdout, 'data'), exited])
  const bound = new AbortController()
  const overdue = sleep(EXIT_AFTER_ANSWER_MS, false, { signal: bound.signal }).catch(() => false)
  const exitedInTime = await Promise.race([exited.then(() => true), overdue])
  bound.abort()
  const [code] = (await closed) as [number]
  return { code, stdout, stderr, exitedInTime }
}

t.test('with the embedded PostgreSQL (no DATABASE_URL), each command exits as soon as it has answered', async t => {
  const dir = await mkdtemp(path.join(tmpdir(), 'petstore-keys-'))
  t.teardown(async () => {
    await rm(dir, { recursive: true, force: true })
  })
  const created = await keysEmbedded(['create', '--name', 'embedded', '--scope', 'read'], dir)
  t.equal(created.code, 0, created.stderr)
  t.ok(created.exitedInTime, `create exited within ${EXIT_AFTER_ANSWER_MS} ms of its answer`)
  const listed = await keysEmbedded(['list', '--json'], dir)
  t.equal(listed.code, 0, listed.stderr)
  t.ok(listed.exitedInTime, `list exited within ${EXIT_AFTER_ANSWER_MS} ms of its answer`)
  const [key] = JSON.parse(listed.stdout) as Array<{ id: number; name: string }>
  t.equal(key?.name, 'embedded')
  const revoked = await keysEmbedded(['revoke', String(key?.id)], dir)
  t.equal(revoked.code, 0, revoked.stderr)
  t.ok(revoked.exitedInTime, `revoke exited within ${EXIT_AFTER_ANSWER_MS} ms of its answer`)
})
