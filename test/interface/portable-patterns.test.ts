import { spawnSync } from 'node:child_process'
import t, { type Test } from 'tap'
import { parse as parseYaml } from 'yaml'
import { AUTH, testApp } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'

/*
 * Every `pattern` in the served document is compiled by each consumer's own engine:
 * Ajv with and without the `u` flag (Postman, Newman), Python's `re` (jsonschema,
 * openapi-spec-validator), Rust's `regex` (pydantic v2), Go's RE2 (kin-openapi). This
 * file finds every pattern anywhere in the document, checks it keeps to a subset all
 * of them read alike (RFC 9485 I-Regexp, plus the ^ and $ that JSON Schema's search
 * semantics need), and runs it in both JavaScript modes (and Python's `re` when a
 * python3 is installed) over a table of strings.
 */

const db = await testDatabase(t)
const { app } = await testApp(t, db.url)
const doc = (await app.inject({ method: 'GET', url: '/docs/openapi.json' })).json() as unknown

interface Found {
  pointer: string
  pattern: string
}

/** A string as ASCII, for assertion names: a raw U+0085 or U+2028 would break TAP's lines. */
const ascii = (s: string): string =>
  JSON.stringify(s).replace(/[^\x20-\x7e]/g, c => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)

/** Every string under a `pattern` key, with its JSON pointer, however deep. */
function collectPatterns (value: unknown, pointer = ''): Found[] {
  if (Array.isArray(value)) return value.flatMap((item, i) => collectPatterns(item, `${pointer}/${i}`))
  if (value === null || typeof value !== 'object') return []
  return Object.entries(value).flatMap(([key, item]) => [
    ...(key === 'pattern' && typeof item === 'string' ? [{ pointer: `${pointer}/pattern`, pattern: item }] : []),
    ...collectPatterns(item, `${pointer}/${key.replace(/~/g, '~0').replace(/\//g, '~1')}`)
  ])
}

/** Escapes that mean the same everywhere: one syntax character, tab, line feed, carriage return. */
const SINGLE_CHAR_ESCAPES = new Set('()*+-.?[\\]^{|}nrt'.split(''))

/**
 * What in `pattern` leaves the portable subset, or [] when nothing does. Stricter than
 * I-Regexp where engines disagree: no `.` (line terminators; one code unit or one code
 * point), no surrogates (an astral character in a class is two units without `u`).
 */
function portabilityProblems (pattern: string): string[] {
  const problems: string[] = []
  const escape = (i: number): number => {
    const next = pattern[i + 1]
    if (next === undefined) problems.push(`a trailing backslash at ${i}`)
    else if (!SINGLE_CHAR_ESCAPES.has(next)) {
      problems.push(`the regex escape \\${next} at ${i} (write the character itself, as a JSON escape if need be)`)
    }
    return i + 2
  }
  let i = 0
  while (i < pattern.length) {
    const c = pattern[i] as string
    const code = c.charCodeAt(0)
    if (code >= 0xd800 && code <= 0xdfff) {
      problems.push(`a surrogate (astral character) at ${i}`)
      i++
    } else if (c === '\\') {
      i = escape(i)
    } else if (c === '^') {
      if (i !== 0) problems.push(`^ not at the start (${i})`)
      i++
    } else if (c === '$') {
      if (i !== pattern.length - 1) problems.push(`$ not at the end (${i})`)
      i++
    } else if (c === '.') {
      problems.push(`. at ${i} (its meaning differs between engines and modes)`)
      i++
    } else if (c === '(') {
      if (pattern[i + 1] === '?') {
        problems.push(`the group (?${pattern[i + 2] ?? ''} at ${i} (look-around, named or flag groups)`)
      }
      i++
    } else if (c === '[') {
      let j = i + 1
      if (pattern[j] === '^') j++
      if (pattern[j] === ']') problems.push(`a class that starts with ] at ${i}`)
      for (;;) {
        const d = pattern[j]
        if (d === undefined) {
          problems.push(`an unclosed class at ${i}`)
          break
        }
        if (d === ']') {
          j++
          break
        }
        const dcode = d.charCodeAt(0)
        if (d === '\\') {
          j = escape(j)
          continue
        }
        if (d === '[') problems.push(`[ inside a class at ${j} (nested classes and set operations in Python and Rust)`)
        if (dcode >= 0xd800 && dcode <= 0xdfff) problems.push(`a surrogate (astral character) in a class at ${j}`)
        const pair = pattern.slice(j, j + 2)
        if (['&&', '--', '~~', '||'].includes(pair)) {
          problems.push(`${pair} in a class at ${j} (a set operation in Rust, a warning in Python)`)
        }
        j++
      }
      i = j
    } else if (c === '{') {
      const quantifier = /^\{(\d+)(,(\d*))?\}/.exec(pattern.slice(i))
      if (quantifier === null) problems.push(`a { that is not a quantifier at ${i}`)
      i += quantifier?.[0].length ?? 1
      if (pattern[i] === '?' || pattern[i] === '+') problems.push(`a lazy or possessive quantifier at ${i}`)
    } else if (c === '*' || c === '+' || c === '?') {
      i++
      if (pattern[i] === '?' || pattern[i] === '+') problems.push(`a lazy or possessive quantifier at ${i}`)
    } else if (c === ']' || c === '}') {
      problems.push(`an unmatched ${c} at ${i} (a literal only in some engines)`)
      i++
    } else {
      i++
    }
  }
  // Back-references (\1, \k<n>) and \p{..}, \uXXXX, \x.., \s, \d, \w, \b fail the escape check above.
  return problems
}

t.test('the subset checker refuses what breaks other engines, and accepts what does not', async t => {
  for (const bad of [
    '^[^\\p{Cc}]*$',
    '^(?=[\\s\\S]*\\S)a$',
    '^(?!x)a$',
    '^(?<=a)b$',
    '^(a)\\1$',
    '^(?<n>a)\\k<n>$',
    '^[\\u0000-\\u001F]$',
    '^\\x41$',
    '^\\x{41}$',
    '^\\d+$',
    '^\\s$',
    '^a.b$',
    '^a*?$',
    '^[a-z&&[^b]]$',
    '^[a--b]$',
    '^a^b$',
    '^a$b$',
    '^😀$',
    '^[😀]$',
    '^a{x}$',
    'a]',
    '^\\bfoo$'
  ]) {
    t.not(portabilityProblems(bad).length, 0, `refused: ${bad}`)
  }
  for (const good of [
    '^[1-9][0-9]{0,18}$',
    '^[!-~]+$',
    '^[^\u0000-\u001F]*$',
    '^(ab|cd)+$',
    '^a\\.b\\-c\\\\$',
    '^[a\\]]$',
    '^\u00e9{1,}$'
  ]) {
    t.same(portabilityProblems(good), [], `accepted: ${ascii(good)}`)
  }
})

const found = collectPatterns(doc)

t.test('every pattern in the served document keeps to the portable subset', async t => {
  t.ok(found.length >= 4, `${found.length} patterns found (names, descriptions, ids, Idempotency-Key)`)
  for (const { pointer, pattern } of found) {
    t.same(portabilityProblems(pattern), [], `${pointer}: ${ascii(pattern)}`)
  }
})

t.test('/docs/yaml holds the same patterns, with no character YAML 1.2 allows only escaped', async t => {
  const res = await app.inject({ method: 'GET', url: '/docs/yaml' })
  t.equal(res.statusCode, 200)
  // YAML's printable set: tab, LF, CR, U+0020-U+007E, NEL, U+00A0-U+D7FF, U+E000-U+FFFD and astral code points.
  const unprintable = [...res.body].filter(
    c => !/^[\t\n\r\u0020-\u007e\u0085\u00a0-\ud7ff\ue000-\ufffd]$/.test(c) && !(c.length === 2)
  )
  t.same(unprintable.map(ascii), [], 'no raw DEL, C0 or C1 control (PyYAML refuses the file)')
  t.same(parseYaml(res.body), doc, 'the YAML reads as the JSON document')
})

/* ---------- The table: one string per class, with what the name and description rules say ---------- */

interface Row {
  label: string
  value: string
  name: boolean
  description: boolean
}
const row = (label: string, value: string, name: boolean, description = name): Row => ({
  label,
  value,
  name,
  description
})
const hex = (c: number): string => `U+${c.toString(16).toUpperCase().padStart(4, '0')}`
const range = (from: number, to: number): number[] => Array.from({ length: to - from + 1 }, (_, i) => from + i)
const TAB_LF_CR = [0x09, 0x0a, 0x0d]
const WHITESPACE = [0x20, 0xa0, 0x1680, ...range(0x2000, 0x200a), 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff]

const table: Row[] = [
  row('ASCII', 'Dogs', true),
  row('ASCII punctuation and spaces inside', ' a-b_c! ', true),
  row('accented', 'Café crème, Ünïcödé', true),
  row('combining accent', 'e\u0301', true),
  row('CJK', '日本語の猫', true),
  row('emoji (a surrogate pair)', '😀', true),
  row('emoji sequence with ZWJ and a variation selector', '👩‍👩‍👧 ❤️', true),
  row('astral CJK', '𠮷野家', true),
  row('zero-width space is not whitespace', '\u200b', true),
  row('U+FFFD and noncharacters', '\ufffd\ufffe\uffff', true),
  row('empty', '', false, true),
  ...range(0x00, 0x1f).map(c =>
    row(`C0 ${hex(c)} inside`, `a${String.fromCharCode(c)}b`, false, TAB_LF_CR.includes(c))
  ),
  ...range(0x00, 0x1f).map(c => row(`C0 ${hex(c)} alone`, String.fromCharCode(c), false, TAB_LF_CR.includes(c))),
  row('DEL', 'a\u007fb', false),
  ...range(0x80, 0x9f).map(c => row(`C1 ${hex(c)}`, `a${String.fromCharCode(c)}b`, false)),
  row('trailing line feed', 'a\n', false, true),
  row('leading line feed', '\na', false, true),
  row('CR LF', 'a\r\nb', false, true),
  ...WHITESPACE.map(c => row(`whitespace only: ${hex(c)}`, String.fromCharCode(c).repeat(2), false, true)),
  ...WHITESPACE.map(c => row(`${hex(c)} around text`, `${String.fromCharCode(c)}x${String.fromCharCode(c)}`, true)),
  row('whitespace only, mixed', ' \u00a0\u2003\u3000\ufeff', false, true),
  row('whitespace and a tab', ' \t ', false, true)
]
/** Lone surrogates: no portable pattern can say it; the server refuses them (checked below). */
const loneSurrogates: Row[] = [
  row('lone high surrogate', 'a\ud800b', false),
  row('lone low surrogate', '\udc00', false),
  row('reversed pair', '\udc00\ud800', false)
]

/** The patterns the name and description rules are expected of: every `name` and `description` property. */
const ruleOf = (pointer: string): 'name' | 'description' | undefined => {
  const match = /\/properties\/(name|description)\/pattern$/.exec(pointer)
  return match?.[1] as 'name' | 'description' | undefined
}

t.test(
  'each pattern gives the same verdict with and without the u flag, and names and descriptions the expected one',
  async t => {
    t.ok(
      found.some(f => ruleOf(f.pointer) === 'name'),
      'the document has a name pattern'
    )
    t.ok(
      found.some(f => ruleOf(f.pointer) === 'description'),
      'the document has a description pattern'
    )
    for (const { pointer, pattern } of found) {
      const plain = new RegExp(pattern)
      const unicode = new RegExp(pattern, 'u')
      const rule = ruleOf(pointer)
      let disagreements = 0
      let wrong = 0
      for (const r of [...table, ...loneSurrogates]) {
        const verdict = plain.test(r.value)
        if (verdict !== unicode.test(r.value)) {
          disagreements++
          t.fail(`${pointer}: ${r.label}: without u ${String(verdict)}, with u ${String(!verdict)}`)
        }
        if (rule !== undefined && !loneSurrogates.includes(r) && verdict !== r[rule]) {
          wrong++
          const given = verdict ? 'accepted' : 'refused'
          const wanted = r[rule] ? 'accept' : 'refuse'
          t.fail(`${pointer}: ${r.label} ${ascii(r.value)}: ${given}, the ${rule} rule says ${wanted}`)
        }
      }
      t.equal(
        disagreements,
        0,
        `${pointer}: both JavaScript modes agree on ${table.length + loneSurrogates.length} strings`
      )
      if (rule !== undefined) t.equal(wrong, 0, `${pointer}: the ${rule} rule's verdicts on ${table.length} strings`)
    }
  }
)

t.test('the server gives the same verdicts, and refuses lone surrogates the patterns cannot name', async t => {
  const messages = {
    name: "'name' must contain at least one non-whitespace character and no control characters, NUL or lone surrogates",
    description: "'description' must not contain NUL, lone surrogates " +
      'or control characters other than tab, line feed and carriage return'
  }
  for (const field of ['name', 'description'] as const) {
    for (const r of [...table, ...loneSurrogates]) {
      const body = field === 'name' ? { name: r.value } : { name: 'a', description: r.value }
      const res = await app.inject({
        method: 'POST',
        url: '/v1/categories',
        headers: { ...AUTH, 'content-type': 'application/json' },
        payload: JSON.stringify(body)
      })
      // The empty name fails minLength first, with a message of its own.
      if (field === 'name' && r.value === '') {
        t.equal(res.statusCode, 400, 'empty name')
        continue
      }
      if (r[field]) {
        t.equal(res.statusCode, 201, `${field}: ${r.label}`)
      } else {
        t.same(res.json(), { code: 'VALIDATION_FAILED', message: messages[field], status: 400 }, `${field}: ${r.label}`)
      }
    }
  }
})

const python = spawnSync('python3', ['--version'], { encoding: 'utf8' })
const pythonMissing =
  python.error === undefined && python.status === 0
    ? false
    : 'python3 is not installed: the JavaScript checks above ran, the Python checks are skipped'
/** Whether python3 can import `module` (a reason to skip when it cannot). */
const pythonModule = (module: string, what: string, pip = module.replace(/_/g, '-')): false | string => {
  if (pythonMissing !== false) return pythonMissing
  const probe = spawnSync('python3', ['-c', `import ${module}`], { encoding: 'utf8' })
  return probe.status === 0
    ? false
    : `python3 has no ${module} module: the ${what} check is skipped (pip install ${pip} runs it)`
}

/** Runs a Python script with `input` as JSON on stdin; its stdout is JSON. */
function runPython (t: Test, script: string, input: unknown): unknown {
  const run = spawnSync('python3', ['-c', script], { input: JSON.stringify(input), encoding: 'utf8' })
  t.equal(run.status, 0, `python3 ran: ${run.stderr}`)
  return JSON.parse(run.stdout === '' ? 'null' : run.stdout)
}

t.test(
  'Python re compiles each pattern and agrees (re.search, as jsonschema runs it)',
  { skip: pythonMissing },
  async t => {
    const strings = [...table, ...loneSurrogates].map(r => r.value)
    // json.loads keeps lone surrogates (as \udXXX escapes) as they are. Warnings are errors: Python
    // warns about constructs (nested sets, set operations) whose meaning it means to change.
    const script = `
import json, re, sys, warnings
warnings.simplefilter("error")
data = json.load(sys.stdin)
out = []
for p in data["patterns"]:
    search = re.compile(p).search
    # What fastjsonschema does: a final $ as \\Z, end of string only.
    strict = re.compile(p[:-1] + "\\\\Z" if p.endswith("$") else p).search
    out.append([[search(s) is not None for s in data["strings"]], [strict(s) is not None for s in data["strings"]]])
json.dump(out, sys.stdout)
`
    const verdicts = runPython(t, script, { patterns: found.map(f => f.pattern), strings }) as Array<
      [boolean[], boolean[]]
    >
    t.comment(`${python.stdout.trim()}: ${found.length} patterns, ${strings.length} strings`)
    found.forEach(({ pointer, pattern }, i) => {
      const js = new RegExp(pattern, 'u')
      const [search, strict] = verdicts[i] ?? [[], []]
      const differences = strings.filter((s, k) => search[k] !== js.test(s))
      // Python's $ also matches before a final line feed: "a\n" passes a name pattern there. No pattern
      // without look-ahead can refuse it in Python (JavaScript has no \Z), so the server refuses it.
      t.same(
        differences.filter(s => !s.endsWith('\n')).map(ascii),
        [],
        `${pointer}: re.search agrees except on a final line feed`
      )
      t.same(
        strings.filter((s, k) => strict[k] !== js.test(s)).map(ascii),
        [],
        `${pointer}: with a final \\Z, re agrees on every string`
      )
    })
  }
)

t.test(
  'Rust regex (through pydantic v2) compiles each pattern and agrees',
  { skip: pythonModule('pydantic', 'Rust regex (pydantic)') },
  async t => {
    // A Rust string cannot hold a lone surrogate at all: those rows are left out.
    const strings = table.map(r => r.value)
    const script = `
import json, sys
from typing import Annotated
from pydantic import StringConstraints, TypeAdapter, ValidationError
data = json.load(sys.stdin)
def verdict(adapter, s):
    try:
        adapter.validate_python(s)
        return True
    except ValidationError:
        return False
out = []
for p in data["patterns"]:
    adapter = TypeAdapter(Annotated[str, StringConstraints(pattern=p)])
    out.append([verdict(adapter, s) for s in data["strings"]])
json.dump(out, sys.stdout)
`
    const verdicts = runPython(t, script, { patterns: found.map(f => f.pattern), strings }) as boolean[][]
    found.forEach(({ pointer, pattern }, i) => {
      const js = new RegExp(pattern, 'u')
      t.same(
        strings.filter((s, k) => verdicts[i]?.[k] !== js.test(s)).map(ascii),
        [],
        `${pointer}: pydantic (Rust regex) agrees on ${strings.length} strings`
      )
    })
  }
)

t.test(
  'PyYAML, strict about YAML 1.2 characters, reads /docs/yaml as the JSON document',
  { skip: pythonModule('yaml', 'PyYAML', 'PyYAML') },
  async t => {
    const yamlText = (await app.inject({ method: 'GET', url: '/docs/yaml' })).body
    const script = `
import json, sys, yaml
data = json.load(sys.stdin)
try:
    json.dump(yaml.safe_load(data["yaml"]) == data["json"], sys.stdout)
except yaml.YAMLError as e:
    json.dump(str(e)[:300], sys.stdout)
`
    t.equal(runPython(t, script, { yaml: yamlText, json: doc }), true)
  }
)

t.test(
  'openapi-spec-validator, the Python reference validator, accepts the served document',
  { skip: pythonModule('openapi_spec_validator', 'openapi-spec-validator') },
  async t => {
    const script = `
import json, sys
from openapi_spec_validator import validate
try:
    validate(json.load(sys.stdin))
    json.dump("valid", sys.stdout)
except Exception as e:
    json.dump(str(e)[:500], sys.stdout)
`
    t.equal(runPython(t, script, doc), 'valid')
  }
)
