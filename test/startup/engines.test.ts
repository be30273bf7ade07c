import { readFileSync } from 'node:fs'
import semver from 'semver'
import t from 'tap'

/*
 * package.json's engines is what the README promises: `npm ci && npm start` and `npm test`
 * on each of those Node.js lines, with no EBADENGINE warning. Every locked package (the
 * dev ones too: npm ci installs them for npm start and npm test) must accept the lowest
 * version of each line. A dependency that needs more is either overridden (package.json
 * "overrides", to a release that supports our lines) or the claim changes, in both places.
 */

interface Lock {
  packages: Record<string, { version?: string; engines?: { node?: string } | string[]; os?: string[] }>
}

const claim = (JSON.parse(readFileSync('package.json', 'utf8')) as { engines: { node: string } }).engines.node
const lowest = claim.split('||').map(range => semver.minVersion(range.trim())?.version ?? range)
const lock = JSON.parse(readFileSync('package-lock.json', 'utf8')) as Lock

t.test(
  `every locked package runs on the lowest version of each claimed line (${claim}: ${lowest.join(', ')})`,
  async t => {
    const refusing = Object.entries(lock.packages).flatMap(([where, info]) => {
      const range = Array.isArray(info.engines) ? undefined : info.engines?.node
      if (where === '' || range === undefined) return []
      return lowest
        .filter(version => !semver.satisfies(version, range, { includePrerelease: true }))
        .map(
          version =>
            `${where.replace(/^.*node_modules\//, '')}@${info.version ?? '?'} needs node ${range}, not ${version}`
        )
    })
    t.same(refusing, [])
  }
)

t.test('the Node.js running this test is one the claim covers', async t => {
  t.ok(semver.satisfies(process.versions.node, claim), `${process.versions.node} satisfies ${claim}`)
})
