import neostandard from 'neostandard'

/*
 * Import directions over src/ (docs/architecture.md): resources -> machinery -> db,
 * and the HTTP infrastructure imports no resource. Each layer lists what it must
 * not reach up (or across) to.
 */
const RESOURCES = ['**/categories/**', '**/pets/**', '**/store/**']
const ENTRY_POINTS = ['**/app.js', '**/server.js']
const layer = (files, patterns, why) => ({
  files,
  rules: { 'no-restricted-imports': ['error', { patterns: [{ group: patterns, message: why }] }] }
})

export default [
  ...neostandard({ ts: true, ignores: ['dist/**', 'coverage/**', '.tap/**', 'data/**', '.cache/**', 'node_modules/**'] }),
  layer(['src/shared/**'], ['../*', './*/**', ...RESOURCES, ...ENTRY_POINTS],
    'src/shared holds leaf modules every layer may import; they import nothing of the service.'),
  layer(['src/db/**'], ['**/http/**', '**/machinery/**', ...RESOURCES, ...ENTRY_POINTS],
    'src/db is the bottom layer: it raises database errors and imports no HTTP, machinery or resource code.'),
  layer(['src/machinery/**'], ['**/http/**', ...RESOURCES, ...ENTRY_POINTS],
    'The machinery serves any resource over src/db: it names no resource and knows nothing of HTTP.'),
  layer(['src/plugins/**'], [...RESOURCES, ...ENTRY_POINTS],
    'src/plugins wires the shared machinery for every resource and names none.'),
  layer(['src/http/**'], [...RESOURCES, ...ENTRY_POINTS],
    'HTTP infrastructure serves every resource and imports none.')
]
