import { readFileSync } from 'node:fs'
import t from 'tap'
import { nodeFlagsOf, serviceNodeFlags } from '../../bench/start-command.js'

// npm start, the container image and the benchmark must run the service alike (docs/performance.md, memory).
t.test('the image runs node with the flags of npm start', async t => {
  const flags = serviceNodeFlags()
  t.ok(
    flags.includes('--max-semi-space-size=8') && flags.includes('--max-old-space-size=512'),
    `npm start caps the young generation and the heap (${flags.join(' ')})`
  )
  t.match(
    flags.join(' '),
    /--import \.\/dist\/telemetry\.js/,
    'npm start loads the tracing setup before the service (src/telemetry.ts)'
  )
  const cmd = /^CMD (\[.*\])$/m.exec(readFileSync('Dockerfile', 'utf8'))
  t.ok(cmd, 'the Dockerfile has an exec-form CMD')
  t.same(JSON.parse(cmd?.[1] ?? '[]'), ['node', ...flags, 'dist/server.js'])
})

t.test('the bench reads the flags of a start script, and refuses one of another shape', async t => {
  t.same(nodeFlagsOf('node dist/server.js'), [])
  t.throws(() => nodeFlagsOf('tsx src/server.ts'), /package.json start is not/)
})
