import { setTimeout as sleep } from 'node:timers/promises'

/** Waits until `check` holds, polling every `pollMs`; throws naming `what` after `timeoutMs`. */
export async function until (
  what: string, check: () => Promise<boolean>, timeoutMs = 10000, pollMs = 2
): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`)
    await sleep(pollMs)
  }
}
