import { mkdtemp, rm } from 'node:fs/promises'
import { createServer } from 'node:http'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { type Page } from 'playwright-core'
import t from 'tap'
import { freePort } from '../helpers/ports.js'
import { launchChromium } from './chromium.js'
import { startServer } from '../helpers/server-process.js'

/*
 * CORS in a real browser (headless Chromium): the service allows one origin
 * (CORS_ORIGINS); a page served from there lists, creates with an Idempotency-Key
 * and reads ETag, Location and an Error body from JavaScript. The same page from a
 * third origin (localhost instead of 127.0.0.1: another origin, same server) is
 * blocked by the browser: its fetch rejects. Run with `npm run test:browser`.
 */

t.setTimeout(300000)
const KEY = `browser-cors-${Date.now()}`

const work = await mkdtemp(path.join(tmpdir(), 'petstore-cors-browser-'))
const data = await mkdtemp(path.join(tmpdir(), 'petstore-cors-browser-data-'))
t.teardown(async () => {
  await rm(work, { recursive: true, force: true })
})
t.teardown(async () => {
  await rm(data, { recursive: true, force: true })
})

// The pages' server: an empty HTML page on every path, on a port of its own.
const pages = createServer((_req, res) => {
  res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end('<!doctype html><title>a front end</title>')
})
const pagePort = await freePort()
await new Promise<void>(resolve => pages.listen(pagePort, '127.0.0.1', resolve))
t.teardown(() => {
  pages.close()
})
const allowedOrigin = `http://127.0.0.1:${pagePort}`
const otherOrigin = `http://localhost:${pagePort}`

const env: Record<string, string> = { API_KEYS: KEY, DATA_DIR: data, CORS_ORIGINS: allowedOrigin }
if (process.env.DATABASE_URL !== undefined && process.env.DATABASE_URL !== '') {
  env.DATABASE_URL = process.env.DATABASE_URL
}
const server = await startServer(t, env)
const api = `http://127.0.0.1:${server.port}`

const context = await launchChromium(t, path.join(work, 'profile'))

async function openPage (origin: string): Promise<Page> {
  const page = await context.newPage()
  await page.goto(`${origin}/app.html`)
  t.teardown(async () => {
    await page.close()
  })
  return page
}

t.test('a page on the allowed origin lists, creates and reads the exposed headers', async t => {
  const page = await openPage(allowedOrigin)
  const seen = await page.evaluate(
    async ({ api, key }) => {
      const auth = { authorization: `Bearer ${key}` }
      const list = await fetch(`${api}/v1/categories`, { headers: auth })
      const etag = list.headers.get('etag')
      const created = await fetch(`${api}/v1/categories`, {
        method: 'POST',
        headers: { ...auth, 'content-type': 'application/json', 'idempotency-key': `page-${Date.now()}` },
        body: JSON.stringify({ name: 'made in a browser' })
      })
      const unchanged = await fetch(`${api}/v1/categories`, { headers: { ...auth, 'if-none-match': etag ?? '' } })
      const refused = await fetch(`${api}/v1/categories`)
      return {
        list: {
          status: list.status,
          etag,
          requestId: list.headers.get('x-request-id'),
          isArray: Array.isArray(await list.json())
        },
        created: {
          status: created.status,
          location: created.headers.get('location'),
          body: (await created.json()) as { id: string; name: string }
        },
        afterCreate: { status: unchanged.status, etag: unchanged.headers.get('etag') },
        refused: { status: refused.status, body: (await refused.json()) as { code: string } }
      }
    },
    { api, key: KEY }
  )
  t.equal(seen.list.status, 200)
  t.ok(seen.list.isArray, 'the list body is read')
  t.match(seen.list.etag, /^W?\/?".+"$/, 'ETag is readable from JavaScript')
  t.ok(seen.list.requestId, 'X-Request-Id is readable')
  t.equal(seen.created.status, 201)
  t.equal(seen.created.body.name, 'made in a browser')
  t.equal(seen.created.location, `/v1/categories/${seen.created.body.id}`, 'Location is readable from JavaScript')
  t.equal(seen.afterCreate.status, 200, 'the list changed: If-None-Match with the old ETag gets the new list')
  t.not(seen.afterCreate.etag, seen.list.etag)
  t.equal(seen.refused.status, 401)
  t.equal(seen.refused.body.code, 'UNAUTHORIZED', 'the Error body of a 401 is readable')
})

t.test('a page on the allowed origin updates with If-Match, deletes, and follows the Link of a page', async t => {
  const page = await openPage(allowedOrigin)
  const seen = await page.evaluate(
    async ({ api, key }) => {
      const auth = { authorization: `Bearer ${key}` }
      const json = { ...auth, 'content-type': 'application/json' }
      const created = (await (
        await fetch(`${api}/v1/categories`, { method: 'POST', headers: json, body: '{"name":"Dgos"}' })
      ).json()) as { id: number }
      const url = `${api}/v1/categories/${created.id}`
      const etag = (await fetch(url, { headers: auth })).headers.get('etag') ?? ''
      const patch = { method: 'PATCH', body: '{"name":"Dogs"}' }
      const updated = await fetch(url, {
        ...patch,
        headers: { ...auth, 'content-type': 'application/merge-patch+json', 'if-match': etag }
      })
      const stale = await fetch(url, { ...patch, headers: { ...json, 'if-match': etag } })
      const paged = await fetch(`${api}/v1/categories?limit=1`, { headers: auth })
      const deleted = await fetch(url, { method: 'DELETE', headers: auth })
      return {
        updated: {
          status: updated.status,
          etag: updated.headers.get('etag'),
          name: ((await updated.json()) as { name: string }).name
        },
        stale: { status: stale.status, code: ((await stale.json()) as { code: string }).code },
        link: paged.headers.get('link'),
        deleted: deleted.status,
        etag
      }
    },
    { api, key: KEY }
  )
  t.equal(seen.updated.status, 200, 'PATCH with If-Match passes the preflight')
  t.equal(seen.updated.name, 'Dogs')
  t.ok(seen.updated.etag !== null && seen.updated.etag !== seen.etag, 'the new ETag is readable')
  t.same(
    seen.stale,
    { status: 412, code: 'PRECONDITION_FAILED' },
    'a stale If-Match is refused, its Error body readable'
  )
  t.match(seen.link, /^<\/v1\/categories\?limit=1&after=\d+>; rel="next"$/, 'the Link header is readable')
  t.equal(seen.deleted, 204, 'DELETE passes the preflight')
})

t.test('a page on another origin is blocked by the browser', async t => {
  const page = await openPage(otherOrigin)
  const outcome = await page.evaluate(
    async ({ api, key }) => {
      const attempt = async (init: RequestInit): Promise<string> => {
        try {
          const res = await fetch(`${api}/v1/categories`, init)
          return `answered ${res.status}`
        } catch (err) {
          return `rejected: ${(err as Error).name}`
        }
      }
      return {
        withKey: await attempt({ headers: { authorization: `Bearer ${key}` } }),
        create: await attempt({
          method: 'POST',
          headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
          body: '{"name":"not from here"}'
        }),
        simple: await attempt({})
      }
    },
    { api, key: KEY }
  )
  t.equal(outcome.withKey, 'rejected: TypeError', 'a request with a key: the preflight fails')
  t.equal(outcome.create, 'rejected: TypeError', 'a create: the preflight fails')
  t.equal(outcome.simple, 'rejected: TypeError', 'a request without preflight: the response is withheld')
  // The preflights were refused without counting: the address still has its whole failed-authentication budget.
  const probe = await fetch(`${api}/v1/categories`)
  t.equal(probe.status, 401)
  t.match(probe.headers.get('ratelimit'), /^"auth-failures";r=1[0-9];/)
})
