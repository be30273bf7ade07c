import { execFileSync } from 'node:child_process'
import { mkdir, mkdtemp, readFile, rm } from 'node:fs/promises'
import { request as httpRequest } from 'node:http'
import { createServer as createHttpsServer } from 'node:https'
import { networkInterfaces, tmpdir } from 'node:os'
import path from 'node:path'
import { type Page } from 'playwright-core'
import t, { type Test } from 'tap'
import { freePort } from '../helpers/ports.js'
import { launchChromium } from './chromium.js'
import { startServer } from '../helpers/server-process.js'

/*
 * The reference page in a real browser (headless Chromium): over loopback, over the
 * machine's LAN address on plain HTTP, and behind a TLS-terminating proxy. Each time:
 * the page renders with no blocked or failed request, a key is authorized,
 * listCategories is executed against the server of the page, and answers 200.
 * Run with `npm run test:browser` (needs Chromium: CHROMIUM_PATH, default /usr/bin/chromium,
 * and openssl for the proxy's certificate). Screenshots go to .cache/browser/.
 */

t.setTimeout(300000)
const SCREENSHOTS = path.resolve('.cache', 'browser')
const KEY = `browser-${Date.now()}`

const lanAddress = Object.values(networkInterfaces())
  .flat()
  .find(i => i !== undefined && i.family === 'IPv4' && !i.internal)?.address
if (lanAddress === undefined) throw new Error('this machine has no non-loopback IPv4 address to serve the page on')

const work = await mkdtemp(path.join(tmpdir(), 'petstore-browser-'))
// The data directory is a temporary directory of its own: as root, its cluster stays inside it.
const data = await mkdtemp(path.join(tmpdir(), 'petstore-browser-data-'))
t.teardown(async () => {
  await rm(work, { recursive: true, force: true })
})
t.teardown(async () => {
  await rm(data, { recursive: true, force: true })
})
await mkdir(SCREENSHOTS, { recursive: true })

// The service on every address; it believes X-Forwarded-Proto only from the proxy below (loopback).
const env: Record<string, string> = { HOST: '0.0.0.0', API_KEYS: KEY, TRUST_PROXY: '127.0.0.1', DATA_DIR: data }
if (process.env.DATABASE_URL !== undefined && process.env.DATABASE_URL !== '') {
  env.DATABASE_URL = process.env.DATABASE_URL
}
const server = await startServer(t, env)

/** A TLS-terminating proxy on the LAN address, as a load balancer would be: https in, http to the service. */
async function tlsProxy (): Promise<number> {
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'rsa:2048',
      '-nodes',
      '-days',
      '1',
      '-subj',
      '/CN=petstore-browser-test',
      '-keyout',
      path.join(work, 'key.pem'),
      '-out',
      path.join(work, 'cert.pem')
    ],
    { stdio: 'ignore' }
  )
  const proxy = createHttpsServer(
    { key: await readFile(path.join(work, 'key.pem')), cert: await readFile(path.join(work, 'cert.pem')) },
    (req, res) => {
      const upstream = httpRequest(
        {
          host: '127.0.0.1',
          port: server.port,
          method: req.method,
          path: req.url,
          headers: { ...req.headers, 'x-forwarded-proto': 'https', 'x-forwarded-for': req.socket.remoteAddress ?? '' }
        },
        answer => {
          res.writeHead(answer.statusCode ?? 502, answer.headers)
          answer.pipe(res)
        }
      )
      upstream.on('error', () => {
        res.writeHead(502).end()
      })
      req.pipe(upstream)
    }
  )
  const port = await freePort()
  await new Promise<void>(resolve => proxy.listen(port, lanAddress, resolve))
  t.teardown(() => {
    proxy.close()
  })
  return port
}

// the proxy's certificate is self-signed
const context = await launchChromium(t, path.join(work, 'profile'), { ignoreHTTPSErrors: true })

/** Loads the page at `base`, authorizes, executes listCategories; returns what went wrong on the way. */
async function tryListCategories (t: Test, base: string, name: string): Promise<void> {
  const page: Page = await context.newPage()
  const problems: string[] = []
  page.on('requestfailed', request => {
    problems.push(`request failed: ${request.url()} (${request.failure()?.errorText ?? ''})`)
  })
  page.on('console', message => {
    if (/Content Security Policy|Refused to|Failed to fetch/i.test(message.text())) {
      problems.push(`console: ${message.text()}`)
    }
  })
  try {
    await page.goto(`${base}/docs`)
    await page.locator('.swagger-ui .info .title', { hasText: 'Petstore API' }).waitFor({ timeout: 30000 })
    t.pass(`${name}: the page renders`)

    await page.locator('button.authorize').first().click()
    await page.locator('.modal-ux input').first().fill(KEY)
    await page.locator('.modal-ux button.authorize').click()
    await page.locator('.modal-ux button.btn-done').click()

    const operation = page.locator('#operations-categories-listCategories')
    await operation.locator('.opblock-summary').click()
    await operation.locator('button.try-out__btn').click()
    await operation.locator('button.execute').click()
    const status = operation.locator('.live-responses-table tbody .response-col_status').first()
    await status.waitFor({ timeout: 30000 })
    t.equal((await status.innerText()).trim(), '200', `${name}: listCategories answered 200`)
    t.match(
      await operation.locator('.request-url pre').innerText(),
      `${base}/v1/categories`,
      `${name}: sent to the server of the page`
    )
    await page.screenshot({ path: path.join(SCREENSHOTS, `${name}.png`), fullPage: true })
    console.log(`# screenshot: ${path.join(SCREENSHOTS, `${name}.png`)}`)
  } finally {
    t.same(problems, [], `${name}: nothing blocked or failed`)
    await page.close()
  }
}

t.test('over loopback', async t => {
  await tryListCategories(t, `http://127.0.0.1:${server.port}`, 'loopback')
})
t.test('over the LAN address, plain HTTP', async t => {
  await tryListCategories(t, `http://${lanAddress}:${server.port}`, 'lan-http')
})
t.test('behind a TLS-terminating proxy', async t => {
  await tryListCategories(t, `https://${lanAddress}:${await tlsProxy()}`, 'tls-proxy')
})
