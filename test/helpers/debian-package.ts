import { execFileSync } from 'node:child_process'

/**
 * The first line of `command versionArgs`, after installing `debianPackage` from Debian's
 * packages when the command is missing (that needs root): for the suites that run a real
 * third-party server (HAProxy, PgBouncer, redis-server) and are not part of `npm test`.
 */
export function ensureDebianPackage (command: string, versionArgs: string[], debianPackage = command): string {
  const version = (): string => execFileSync(command, versionArgs, { encoding: 'utf8' }).split('\n')[0] ?? ''
  try {
    return version()
  } catch {}
  if (process.getuid?.() !== 0) {
    throw new Error(`${command} is not installed, and installing it needs root: apt-get install -y ${debianPackage}`)
  }
  execFileSync('apt-get', ['update', '-qq'], { stdio: 'ignore' })
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' }
  execFileSync('apt-get', ['install', '-y', '-qq', debianPackage], { stdio: 'ignore', env })
  return version()
}
