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

function stringEnd (text: string, from: number): number {
  let quote = text.indexOf('"', from)
  for (;;) {
    let backslashes = 0
    while (text.charCodeAt(quote - 1 - backslashes) === 92) backslashes++ // \\
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
  return path.length > 120 ? `${path.slice(0, 120)}…` : path
}

/** The first rule a body breaks, as a 400 message. `text` must be valid JSON: the scan trusts its syntax. */
export function interoperabilityProblem (text: string): string | undefined {
  const frames: Frame[] = []
  let top: Frame | undefined
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c === 34) { // "
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
    } else if (c === 123 || c === 91) { // { [
      if (frames.length === MAX_JSON_DEPTH) return `request body is nested deeper than ${MAX_JSON_DEPTH} levels`
      top = c === 123 ? { names: new Set(), expectName: true, at: 0 } : { expectName: false, at: 0 }
      frames.push(top)
    } else if (c === 125 || c === 93) { // } ]
      frames.pop()
      top = frames[frames.length - 1]
    } else if (c === 44) { // ,
      if (top === undefined) continue
      if (top.names !== undefined) top.expectName = true
      else top.at = (top.at as number) + 1
    } else if (c === 45 || (c >= 48 && c <= 57)) { // - 0-9
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
