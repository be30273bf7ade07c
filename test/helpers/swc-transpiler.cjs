'use strict'
/*
 * How tap's ts-node turns the tests' TypeScript into JavaScript (tsconfig.json's "ts-node"): with swc rather than
 * TypeScript's own emitter, which took a large share of every test process's CPU before its first test. ts-node's
 * bundled swc transpiler drops import attributes (`with { type: 'json' }`), which Node requires: this one keeps them.
 */
const { transformSync } = require('@swc/core')

exports.create = () => ({
  transpile (input, { fileName }) {
    const { code, map } = transformSync(input, {
      filename: fileName,
      swcrc: false,
      sourceMaps: true,
      module: { type: 'es6' },
      jsc: {
        target: 'es2022',
        parser: { syntax: 'typescript' },
        experimental: { keepImportAttributes: true }
      }
    })
    return { outputText: code, sourceMapText: map }
  }
})
