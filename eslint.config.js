import neostandard from 'neostandard'

/*
 * Import directions over src/ (docs/architecture.md): each infrastructure folder may
 * import only the folders (and root modules) listed for it. Whatever else lives in src/
 * is a resource or an entry point, which infrastructure never imports; a new resource
 * folder needs no entry here.
 */
const onlyImports = (group, message) => ({ 'no-restricted-imports': ['error', { patterns: [{ group, message }] }] })
const allow = name => name.endsWith('.js') ? `!../${name}` : `!../${name}/**`
const layer = (folder, allowed, why) => ({
  files: [`src/${folder}/**`],
  rules: onlyImports(['../*/**', '../*.js', ...allowed.map(allow)], why)
})

export default [
  ...neostandard({
    ts: true,
    ignores: [
      'dist/**', 'coverage/**', '.tap/**', 'data/**', '.cache/**', 'node_modules/**', 'clients/**/node_modules/**',
      'clients/typescript/src/generated/**', 'clients/typescript/dist/**', 'packages/*/dist/**'
    ]
  }),
  layer('shared', [], 'src/shared holds leaf modules every layer may import; they import nothing of the service.'),
  layer('db', ['shared', 'config.js', 'startup-error.js'],
    'src/db is the bottom layer: it imports no HTTP, machinery or resource code.'),
  layer('machinery', ['db', 'shared'],
    'The machinery serves any resource over src/db: it names no resource and knows nothing of HTTP.'),
  layer('keys', ['db', 'machinery', 'shared', 'config.js', 'embedded.js', 'startup-checks.js', 'startup-error.js'],
    'src/keys holds the key store over src/db and the command that manages keys: no HTTP, no resource.'),
  layer('http', ['db', 'machinery', 'shared', 'config.js', 'startup-error.js', 'keys/store.js'],
    'HTTP infrastructure serves every resource and imports none; of src/keys, only the store.'),
  {
    files: ['packages/embedded-postgres/**'],
    rules: onlyImports(['../*'], 'packages/embedded-postgres imports none of the service.')
  },
  {
    files: ['src/*.ts', 'test/**', 'bench/**', 'scripts/**'],
    rules: onlyImports(['**/packages/**'], 'Import @petstore/embedded-postgres, its one entry point.')
  },
  {
    files: [
      'src/**/*.ts', 'packages/embedded-postgres/src/*.ts', 'bench/**/*.ts', 'bench/**/*.js',
      'test/**/*.ts', 'scripts/**/*.ts', 'scripts/**/*.mjs', 'eslint.config.js'
    ],
    rules: { '@stylistic/max-len': ['error', { code: 120, ignoreUrls: true }] }
  }
]
