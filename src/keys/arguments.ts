import { parseArgs } from 'node:util'
import { StartupError } from '../startup-error.js'
import type { Scope } from './store.js'

// What `keys` accepts: every argument is checked here, before anything is started or written.

/** 100 years: now plus this stays far inside what a JavaScript Date (to +275760) and a timestamptz hold. */
const MAX_EXPIRES_IN_DAYS = 36500
/** api_keys.rate_limit_per_minute is a PostgreSQL integer. */
const MAX_RATE_LIMIT = 2147483647
const MAX_NAME_LENGTH = 255

const USAGE = [
  'keys create --name NAME --scope read|write [--expires-in DAYS] [--rate-limit N]',
  'keys list [--json]',
  'keys revoke ID',
  'keys help'
]
export const USAGE_HINT = `usage: ${USAGE.join(' | ')}`
export const HELP = `usage: ${USAGE.join('\n       ')}

  --name NAME          what the key is for: 1 to ${MAX_NAME_LENGTH} characters, no control characters
  --scope read|write   read lists and gets; write also creates
  --expires-in DAYS    it expires after DAYS days (fractions allowed), at most ${MAX_EXPIRES_IN_DAYS}; without it, never
  --rate-limit N       requests per minute, 1 to ${MAX_RATE_LIMIT}, instead of RATE_LIMIT_PER_KEY_PER_MINUTE
  --json               list as a JSON array (npm run --silent keys -- list --json: no npm banner before it)

The database: DATABASE_DIRECT_URL, else DATABASE_URL, else the embedded PostgreSQL of DATA_DIR.
`

const OPTIONS = {
  name: { type: 'string' },
  scope: { type: 'string' },
  'expires-in': { type: 'string' },
  'rate-limit': { type: 'string' },
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' }
} as const

/** The options and the number of arguments each command takes. */
const COMMANDS: Record<string, { options: string[], arguments: number }> = {
  create: { options: ['name', 'scope', 'expires-in', 'rate-limit'], arguments: 0 },
  list: { options: ['json'], arguments: 0 },
  revoke: { options: [], arguments: 1 }
}

export interface NewKey { name: string, scope: Scope, expiresInDays: number | null, ratePerMinute: number | null }
export type Request = { command: 'help' } | { command: 'create', key: NewKey } | { command: 'list', json: boolean } |
{ command: 'revoke', id: string }

function fail (message: string): never {
  throw new StartupError(message)
}

function parseOptions (args: string[]) {
  try {
    return parseArgs({ args, options: OPTIONS, allowPositionals: true, tokens: true })
  } catch (err) {
    // An unknown option, or one without its value: parseArgs's own message names it.
    throw new StartupError(`${(err as Error).message}; ${USAGE_HINT}`, { cause: err })
  }
}

export function parse (args: string[]): Request {
  const { values, positionals, tokens } = parseOptions(args)
  const [command, ...rest] = positionals
  if (values.help === true || command === 'help') return { command: 'help' }
  if (command === undefined) fail(USAGE_HINT)
  const takes = COMMANDS[command] ?? fail(`unknown command '${command}'; ${USAGE_HINT}`)
  const given = tokens.flatMap(token => token.kind === 'option' ? [token.name] : [])
  for (const [i, option] of given.entries()) {
    if (given.indexOf(option) !== i) fail(`--${option} is given twice; give each option once`)
    if (!takes.options.includes(option)) fail(`${command} takes no --${option}; ${USAGE_HINT}`)
  }
  const extra = rest[takes.arguments]
  if (extra !== undefined) fail(`${command} takes no argument '${extra}'; ${USAGE_HINT}`)
  if (command === 'create') return { command, key: newKey(values) }
  if (command === 'list') return { command, json: values.json === true }
  return { command: 'revoke', id: keyId(rest[0]) }
}

function newKey (values: { name?: string, scope?: string, 'expires-in'?: string, 'rate-limit'?: string }): NewKey {
  const name = values.name?.trim() ?? ''
  if (name === '' || [...name].length > MAX_NAME_LENGTH || /\p{Cc}/u.test(name)) {
    fail(`--name must be given, 1 to ${MAX_NAME_LENGTH} characters with no control characters`)
  }
  if (values.scope !== 'read' && values.scope !== 'write') fail('--scope must be read or write')
  return {
    name,
    scope: values.scope,
    expiresInDays: expiresInDays(values['expires-in']),
    ratePerMinute: ratePerMinute(values['rate-limit'])
  }
}

function expiresInDays (text: string | undefined): number | null {
  if (text === undefined) return null
  const days = Number(text)
  if (!/^[0-9]+(\.[0-9]+)?$/.test(text) || days <= 0 || days > MAX_EXPIRES_IN_DAYS) {
    fail(`--expires-in must be a number of days above 0, at most ${MAX_EXPIRES_IN_DAYS}`)
  }
  return days
}

function ratePerMinute (text: string | undefined): number | null {
  if (text === undefined) return null
  const rate = Number(text)
  if (!/^[0-9]+$/.test(text) || rate < 1 || rate > MAX_RATE_LIMIT) {
    fail(`--rate-limit must be a whole number from 1 to ${MAX_RATE_LIMIT}`)
  }
  return rate
}

function keyId (text: string | undefined): string {
  if (text === undefined || !/^[1-9][0-9]{0,17}$/.test(text)) {
    fail(`revoke needs the key's id (from keys list); ${USAGE_HINT}`)
  }
  return text
}
