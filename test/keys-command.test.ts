import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import t from 'tap'
import { runMigrations } from '../src/db/migrate.js'
import { testApp } from './helpers/app.js'
import { testDatabase } from './helpers/database.js'
import { withClient } from './helpers/pg-client.js'

/* `npm run keys` as a real process (src/keys/command.ts through tsx, as dist/keys/command.js runs it), on the service's database. */

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
