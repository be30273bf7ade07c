// The contract's text rules (docs/api.md) as JSON Schema patterns, and their meaning in words for 400 messages.
// Every consumer of the document compiles them with its own engine (Ajv with and without `u`, Python's re, Rust's
// regex, Go's RE2), so they keep to I-Regexp (RFC 9485): characters written as themselves, never `\uXXXX`, `\x..`
// or `\p{..}`; no look-around. All are below U+D800, so a surrogate pair reads alike as one code point or two units.

const CONTROLS = '\u0000-\u001F\u007F-\u009F'
// All but tab, line feed and carriage return.
const DESCRIPTION_CONTROLS = '\u0000-\u0008\u000B\u000C\u000E-\u001F\u007F-\u009F'
// JavaScript's \s less its controls, listed: \s means other sets in Python (no U+FEFF), RE2 and Rust (ASCII).
const WHITESPACE = ' \u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000\uFEFF'

export const NAME_PATTERN = `^[^${CONTROLS}]*[^${CONTROLS}${WHITESPACE}][^${CONTROLS}]*$`
export const DESCRIPTION_PATTERN = `^[^${DESCRIPTION_CONTROLS}]*$`
export const IDEMPOTENCY_KEY_PATTERN = '^[!-~]+$'

/** Said in every text field's description: the rule the patterns leave to the server. */
export const NO_LONE_SURROGATES = 'No lone surrogates (a UTF-16 surrogate code unit outside a valid pair, which only ' +
  'a \\u escape in JSON can make): the server refuses them with 400, a pattern cannot say it portably.'

// Ajv's regExp engine (app.ts): a lone surrogate, which PostgreSQL would store as U+FFFD, fails the pattern keyword
// itself, so its 400 names the field's rule like any other failed pattern.
export const wellFormedPattern = Object.assign((pattern: string, flags: string) => {
  const regExp = new RegExp(pattern, flags)
  // Ajv keys its compiled patterns by toString(): without this, every pattern would share the first one's key.
  return { test: (value: string) => value.isWellFormed() && regExp.test(value), toString: () => regExp.toString() }
}, { code: 'wellFormedPattern' })

export const patternRules: Readonly<Record<string, string>> = {
  [NAME_PATTERN]: 'must contain at least one non-whitespace character and no control characters, NUL or ' +
    'lone surrogates',
  [DESCRIPTION_PATTERN]: 'must not contain NUL, lone surrogates or control characters other than tab, line feed ' +
    'and carriage return',
  [IDEMPOTENCY_KEY_PATTERN]: 'must be 1 to 255 visible ASCII characters'
}
