// A body must read the same in every JSON parser (RFC 7493, I-JSON), or a proxy, WAF or audit log in front of us
// may see another value than the one we store: JSON.parse keeps the last of two equal names, turns 1e400 into
// Infinity and 2^53+1 into 2^53. docs/hardening.md has each decision.

// Far below the limits of common parsers (Ruby's 100, Python's recursion limit).
const MAX_JSON_DEPTH = 32

interface Frame {
  names?: Set<string> // an object's member names; an array has none
  expectName: boolean // the next string is a member name
  at: string | number // the current value's member name or index
}

// Up to 15 digits, no exponent: always an exactly held safe integer or a plain decimal.
const SHORT_NUMBER = 15
const NUMBER = /[-+.0-9eE]+/y
/** Longer member paths are cut in messages. */
const MAX_PATH_CHARACTERS = 120

const QUOTE = '"'.charCodeAt(0)
const BACKSLASH = '\\'.charCodeAt(0)
const OPEN_OBJECT = '{'.charCodeAt(0)
const OPEN_ARRAY = '['.charCodeAt(0)
const CLOSE_OBJECT = '}'.charCodeAt(0)
const CLOSE_ARRAY = ']'.charCodeAt(0)
const COMMA = ','.charCodeAt(0)
const MINUS = '-'.charCodeAt(0)
const DIGIT_0 = '0'.charCodeAt(0)
const DIGIT_9 = '9'.charCodeAt(0)

function stringEnd (text: string, from: number): number {
  let quote = text.indexOf('"', from)
  for (;;) {
    let backslashes = 0
    while (text.charCodeAt(quote - 1 - backslashes) === BACKSLASH) backslashes++
    if (backslashes % 2 === 0) return quote
    quote = text.indexOf('"', quote + 1)
  }
}

// Beyond ±(2^53-1) a double holds only some integers (RFC 7493 2.2); a non-zero literal read as 0 underflowed.
// Fractions within range round as in every double-based parser.
function beyondDouble (token: string): boolean {
  const value = Number(token)
  if (value === 0) return /[1-9]/.test(token.split(/[eE]/)[0] ?? '')
  return !(Math.abs(value) <= Number.MAX_SAFE_INTEGER)
}

function describe (frames: Frame[]): string {
  // JSON escapes make control characters and lone surrogates readable; long paths are cut.
  const path = JSON.stringify(frames.map(frame => frame.at).join('.')).slice(1, -1)
  return path.length > MAX_PATH_CHARACTERS ? `${path.slice(0, MAX_PATH_CHARACTERS)}…` : path
}

/** The first rule a body breaks, as a 400 message. `text` must be valid JSON: the scan trusts its syntax. */
export function interoperabilityProblem (text: string): string | undefined {
  const frames: Frame[] = []
  let top: Frame | undefined
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c === QUOTE) {
      const end = stringEnd(text, i + 1)
      if (top?.expectName === true) {
        const raw = text.slice(i + 1, end)
        // Names compare as decoded ("n\u0061me" is "name"); only an escape can make a lone surrogate.
        const name = raw.includes('\\') ? JSON.parse(text.slice(i, end + 1)) as string : raw
        top.at = name
        if (!name.isWellFormed()) return `request body has a member name with a lone surrogate: '${describe(frames)}'`
        if (top.names?.has(name) === true) return `request body has a duplicate member '${describe(frames)}'`
        top.names?.add(name)
        top.expectName = false
      }
      i = end
    } else if (c === OPEN_OBJECT || c === OPEN_ARRAY) {
      if (frames.length === MAX_JSON_DEPTH) return `request body is nested deeper than ${MAX_JSON_DEPTH} levels`
      top = c === OPEN_OBJECT ? { names: new Set(), expectName: true, at: 0 } : { expectName: false, at: 0 }
      frames.push(top)
    } else if (c === CLOSE_OBJECT || c === CLOSE_ARRAY) {
      frames.pop()
      top = frames[frames.length - 1]
    } else if (c === COMMA) {
      if (top === undefined) continue
      if (top.names !== undefined) top.expectName = true
      else top.at = (top.at as number) + 1
    } else if (c === MINUS || (c >= DIGIT_0 && c <= DIGIT_9)) {
      NUMBER.lastIndex = i
      const token = (NUMBER.exec(text) as RegExpExecArray)[0]
      if ((token.length > SHORT_NUMBER || /[eE]/.test(token)) && beyondDouble(token)) {
        const subject = frames.length === 0 ? 'request body' : `'${describe(frames)}'`
        return `${subject} is a number beyond what an IEEE 754 double holds exactly`
      }
      i += token.length - 1
    }
  }
  return undefined
}
