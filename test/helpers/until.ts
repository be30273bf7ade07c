import { setTimeout as sleep } from 'node:timers/promises'

/**
 * Waits until `check` gives a value other than false or undefined, polling every `pollMs`, and answers it; throws
 * naming `what` after `timeoutMs`.
 */
export async function until<T> (
  what: string, check: () => Promise<T | false | undefined>, timeoutMs = 10000, pollMs = 2
): Promise<T> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await check()
    if (value !== false && value !== undefined) return value
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`)
    await sleep(pollMs)
  }
}
