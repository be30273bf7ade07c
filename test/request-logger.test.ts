import { Writable } from 'node:stream'
import Fastify, { type FastifyBaseLogger } from 'fastify'
import t from 'tap'
import { lazyRequestLogger } from '../src/http/request-logger.js'

/** Fastify's own pino logger, writing its lines into an array, and how many children it made. */
function parentLogger (level: string): { logger: FastifyBaseLogger, lines: Array<Record<string, unknown>>, children: () => number } {
  const lines: Array<Record<string, unknown>> = []
  const stream = new Writable({ write (chunk: Buffer, _encoding, done) { lines.push(JSON.parse(chunk.toString())); done() } })
  const pino = Fastify({ logger: { level, stream } }).log
  let made = 0
  // Counts the children made from the parent, and leaves pino's own objects (children inherit from it) alone.
  const logger = new Proxy(pino, {
    get (target, property) {
      if (property === 'child') return (...args: Parameters<FastifyBaseLogger['child']>) => { made++; return target.child(...args) }
      const value: unknown = Reflect.get(target, property)
      return typeof value === 'function' ? value.bind(target) : value
    }
  })
  return { logger, lines, children: () => made }
}

t.test('a line below the level is dropped without making the child; a line at the level is the child\'s line', async t => {
  const { logger, lines, children } = parentLogger('info')
  const log = lazyRequestLogger(logger, { requestId: 'r-1' }, {})
  log.debug({ statusCode: 200 }, 'request completed')
  log.trace('nothing')
  t.equal(children(), 0, 'no pino child for lines nobody writes')
  t.same(lines, [])
  t.equal(log.level, 'info')
  log.info({ statusCode: 404 }, 'request completed')
  log.error('broken %s', 'thing')
  t.equal(children(), 1, 'one child, made once')
  t.match(lines, [
    { level: 30, requestId: 'r-1', statusCode: 404, msg: 'request completed' },
    { level: 50, requestId: 'r-1', msg: 'broken thing' }
  ])
})

t.test('a level of its own (a route\'s logLevel) and the child\'s own children', async t => {
  const { logger, lines } = parentLogger('info')
  const log = lazyRequestLogger(logger, { requestId: 'r-2' }, { level: 'debug' })
  t.equal(log.level, 'debug')
  log.debug('seen at the route\'s level')
  log.child({ part: 'x' }).warn('from a grandchild')
  log.level = 'error'
  log.warn('now below the level')
  t.match(lines, [{ level: 20, requestId: 'r-2' }, { level: 40, requestId: 'r-2', part: 'x' }])
  t.equal(lines.length, 2)
  log.silent('never written')
})
