import { existsSync } from 'node:fs'
import { chromium, type BrowserContext } from 'playwright-core'

/** Debian's Chromium, or CHROMIUM_PATH. */
const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium'

/*
 * Headless, as root, on a machine with no way out: without the background-networking flags, Chromium's own
 * connections are refused many at a time by the closed network.
 */
const ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync'
]

interface Teardown { teardown: (fn: () => Promise<void>) => void }

/** A Chromium context with its profile in `profileDir`, closed when the test ends. */
export async function launchChromium (
  t: Teardown,
  profileDir: string,
  options: { ignoreHTTPSErrors?: boolean } = {}
): Promise<BrowserContext> {
  if (!existsSync(CHROMIUM)) {
    throw new Error(`Chromium not found at ${CHROMIUM}: install it (apt-get install -y chromium) or set CHROMIUM_PATH`)
  }
  const context = await chromium.launchPersistentContext(profileDir, {
    executablePath: CHROMIUM, headless: true, args: ARGS, ...options
  })
  t.teardown(async () => {
    await context.close()
  })
  return context
}
