/*
 * The text rules of the contract (docs/api.md), as JSON Schema patterns, and what
 * each means in words. Resources build their schemas from these patterns; the
 * error handler (http/error-handler.ts) words a failed pattern with its message.
 * Both import this module, so neither imports the other.
 *
 * Every consumer of the published document compiles these patterns with its own
 * engine: Ajv with and without the `u` flag (Postman, Newman), Python's `re`, Rust's
 * `regex` (pydantic), Go's RE2 (kin-openapi). So they keep to what all of them read
 * alike (RFC 9485, I-Regexp): character classes over characters written as the
 * characters themselves (JSON escapes in the document, never `\uXXXX`, `\x..` or
 * `\p{..}` regex escapes), no look-around, no back-references. Every character they
 * name is below U+D800, so a surrogate pair reads the same as one code point or as
 * two code units. What they cannot say (no lone surrogates) the server adds to every
 * pattern it checks: wellFormedPattern below.
 */

/** C0 controls, DEL and C1 controls: U+0000-U+001F, U+007F-U+009F. */
const CONTROLS = '\u0000-\u001F\u007F-\u009F'
/** The controls a description may not hold: all but tab, line feed and carriage return. */
const DESCRIPTION_CONTROLS = '\u0000-\u0008\u000B\u000C\u000E-\u001F\u007F-\u009F'
/**
 * Whitespace that is not a control: JavaScript's \s less its controls, listed, because
 * \s means other sets in Python (no U+FEFF), RE2 and Rust (ASCII only by default).
 */
const WHITESPACE = ' \u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000\uFEFF'

/** A display name: no control characters at all, at least one character that is not whitespace. */
export const NAME_PATTERN = `^[^${CONTROLS}]*[^${CONTROLS}${WHITESPACE}][^${CONTROLS}]*$`
/** Free text: no control characters except tab, line feed and carriage return. */
export const DESCRIPTION_PATTERN = `^[^${DESCRIPTION_CONTROLS}]*$`
/** A canonical decimal id (no sign, no leading zero); the upper bound 2^63-1 is checked as a BigInt. */
export const ID_PATTERN = '^[1-9][0-9]{0,18}$'
export const MAX_ID = 9223372036854775807n
/** Idempotency-Key: visible ASCII, ! to ~, only (the length, 1 to 255, is checked beside it). */
export const IDEMPOTENCY_KEY_PATTERN = '^[!-~]+$'

/** Said in every text field's description: the rule the patterns leave to the server. */
export const NO_LONE_SURROGATES = 'No lone surrogates (a UTF-16 surrogate code unit outside a valid pair, which only a \\u escape in JSON can make): the server refuses them with 400, a pattern cannot say it portably.'

/**
 * The engine Ajv compiles request-schema patterns with (app.ts): the pattern, and a
 * well-formed string. A lone surrogate fails the pattern keyword itself, so its 400
 * names the field's rule like any other failed pattern. PostgreSQL would store it as U+FFFD.
 */
export const wellFormedPattern = Object.assign((pattern: string, flags: string): { test: (value: string) => boolean, toString: () => string } => {
  const regExp = new RegExp(pattern, flags)
  return {
    test: (value: string) => value.isWellFormed() && regExp.test(value),
    // Ajv keys its compiled patterns by toString(): without this, every pattern would share the first one's key.
    toString: () => regExp.toString()
  }
}, { code: 'wellFormedPattern' })

/** What a pattern means, in words, for 400 messages. Keyed by the pattern itself. */
export const patternRules: Readonly<Record<string, string>> = {
  [NAME_PATTERN]: 'must contain at least one non-whitespace character and no control characters, NUL or lone surrogates',
  [DESCRIPTION_PATTERN]: 'must not contain NUL, lone surrogates or control characters other than tab, line feed and carriage return',
  [ID_PATTERN]: 'must be a decimal integer from 1 to 9223372036854775807',
  [IDEMPOTENCY_KEY_PATTERN]: 'must be 1 to 255 visible ASCII characters'
}
