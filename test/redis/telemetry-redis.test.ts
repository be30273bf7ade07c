import t from 'tap'
import { traceInMemory } from '../helpers/tracing.js'

/*
 * With REDIS_URL and tracing on, the rate limits' Redis commands are spans of the
 * request that made them, named by command only: their arguments (the limits'
 * keys, which name client addresses) stay out.
 */

const exporter = await traceInMemory(t)
const { AUTH, listeningApp } = await import('../helpers/app.js')
const { testDatabase } = await import('../helpers/database.js')
const { testRedis } = await import('../helpers/redis.js')

const db = await testDatabase(t)
const redis = await testRedis(t)
const { port } = await listeningApp(t, db.url, { REDIS_URL: redis.url, RATE_LIMIT_PER_KEY_PER_MINUTE: '1000' })

t.test("a request's Redis commands are spans in its trace, without arguments", async t => {
  const traceId = 'dddddddddddddddddddddddddddddd04'
  const res = await fetch(`http://127.0.0.1:${port}/v1/categories`, {
    headers: { ...AUTH, traceparent: `00-${traceId}-00f067aa0ba902b7-01` }
  })
  t.equal(res.status, 200)
  await new Promise(resolve => setTimeout(resolve, 100))
  const spans = exporter.getFinishedSpans().filter(s => s.spanContext().traceId === traceId)
  const commands = spans.filter(s => s.instrumentationScope.name.includes('ioredis'))
  t.ok(commands.length > 0, `Redis spans: ${commands.map(s => s.name).join(', ')}`)
  for (const span of commands) {
    const statement = String(span.attributes['db.query.text'] ?? span.attributes['db.statement'] ?? '')
    t.match(statement, /^[a-z]+$/i, `${span.name}: the command name only (${statement})`)
    t.notMatch(JSON.stringify(span.attributes), /per-key:|auth-failures:/, `${span.name}: no limit keys`)
  }
})
