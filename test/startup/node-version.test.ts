import t from 'tap'
import { TEST_KEY } from '../helpers/app.js'
import { testDatabase } from '../helpers/database.js'
import { startServer } from '../helpers/server-process.js'

/*
 * Node.js 20 is past its end of life, but bare machines still run it: the service starts on it
 * and says once that 22 or 24 is the way on. On 22 and 24 it says nothing of the kind.
 * CI runs this on Node.js 20 and on 24, so each run checks one side.
 */

const db = await testDatabase(t)

const major = Number(process.versions.node.split('.')[0])

const expected = major === 20 ? 'recommends 22 or 24 in one line' : 'says nothing about its Node.js version'

t.test(
  `the built service on Node.js ${process.versions.node} ${expected}`,
  async t => {
    const server = await startServer(t, { DATABASE_URL: db.url, API_KEYS: TEST_KEY })
    server.child.kill('SIGTERM')
    t.equal(await server.exited, 0)
    // Logged once the service listens (a start that fails still says only why, in one line); read when all is written.
    const lines = server
      .output()
      .split('\n')
      .filter(line => /Node\.js/.test(line))
    if (major === 20) {
      t.equal(lines.length, 1, lines.join('\n'))
      t.match(JSON.parse(lines[0] ?? '{}'), {
        level: 40,
        msg: `Node.js ${process.versions.node} is past its end of life; run the service on Node.js 22 or 24`
      })
    } else {
      t.same(lines, [])
    }
  }
)
