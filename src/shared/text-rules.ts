/*
 * The text rules of the contract (docs/api.md), as JSON Schema patterns, and what
 * each means in words. Resources build their schemas from these patterns; the
 * error handler (http/error-handler.ts) words a failed pattern with its message.
 * Both import this module, so neither imports the other.
 *
 * Ajv compiles patterns with the `u` flag, so \p{Cs} matches exactly the lone
 * surrogates (a valid pair is one astral code point) and lengths count code points.
 */

/** A display name: no control characters at all, no lone surrogates, at least one non-whitespace character. */
export const NAME_PATTERN = '^(?=[\\s\\S]*\\S)[^\\p{Cc}\\p{Cs}]*$'
/** Free text: no control characters except tab, line feed and carriage return; no lone surrogates. */
export const DESCRIPTION_PATTERN = '^[^\\p{Cs}\\u0000-\\u0008\\u000B\\u000C\\u000E-\\u001F\\u007F-\\u009F]*$'
/** A canonical decimal id (no sign, no leading zero); the upper bound 2^63-1 is checked as a BigInt. */
export const ID_PATTERN = '^[1-9][0-9]{0,18}$'
export const MAX_ID = 9223372036854775807n
/** Idempotency-Key: visible ASCII only (the length, 1 to 255, is checked beside it). */
export const IDEMPOTENCY_KEY_PATTERN = '^[\\x21-\\x7E]+$'

/** What a pattern means, in words, for 400 messages. Keyed by the pattern itself. */
export const patternRules: Readonly<Record<string, string>> = {
  [NAME_PATTERN]: 'must contain at least one non-whitespace character and no control characters, NUL or lone surrogates',
  [DESCRIPTION_PATTERN]: 'must not contain NUL, lone surrogates or control characters other than tab, line feed and carriage return',
  [ID_PATTERN]: 'must be a decimal integer from 1 to 9223372036854775807',
  [IDEMPOTENCY_KEY_PATTERN]: 'must be 1 to 255 visible ASCII characters'
}
