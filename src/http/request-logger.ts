import type { FastifyBaseLogger } from 'fastify'

type LogArgs = any[]
type Bindings = Parameters<FastifyBaseLogger['child']>[0]
type ChildLoggerOptions = NonNullable<Parameters<FastifyBaseLogger['child']>[1]>
/** Fastify's logger is pino, which can tell whether a level is enabled. */
type Logger = FastifyBaseLogger & { isLevelEnabled: (level: string) => boolean }

type Level = 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace'

/**
 * request.log, made only when it writes. Fastify gives every request a pino
 * child logger, and pino serializes the child's bindings (the request id) when
 * it is made: a measurable share of a cached GET (bench/profile.ts) for a
 * logger that, at the default level, writes nothing for a successful request.
 * This stands in for the child and makes the real one, with the same bindings
 * and options, the first time a line is written at an enabled level; lines
 * below the level cost one comparison. What is written is what the child
 * would have written.
 */
class LazyRequestLogger implements FastifyBaseLogger {
  private made: FastifyBaseLogger | undefined

  constructor (private readonly parent: Logger, private readonly bindings: Bindings, private readonly options: ChildLoggerOptions) {}

  get level (): string { return this.made?.level ?? this.options.level ?? this.parent.level }
  set level (level: string) { this.real().level = level }

  // Methods on the prototype, not per-instance closures: this object is made for every request.
  fatal (...args: LogArgs): void { this.write('fatal', args) }
  error (...args: LogArgs): void { this.write('error', args) }
  warn (...args: LogArgs): void { this.write('warn', args) }
  info (...args: LogArgs): void { this.write('info', args) }
  debug (...args: LogArgs): void { this.write('debug', args) }
  trace (...args: LogArgs): void { this.write('trace', args) }
  silent (): void {}

  child (bindings: Bindings, options?: ChildLoggerOptions): FastifyBaseLogger {
    return this.real().child(bindings, options)
  }

  private write (level: Level, args: LogArgs): void {
    // A route or child level (options.level) is the child's own; otherwise the parent's decides.
    if (this.made === undefined && this.options.level === undefined && !this.parent.isLevelEnabled(level)) return
    const real = this.real() as unknown as Record<Level, (...a: LogArgs) => void>
    real[level](...args)
  }

  private real (): FastifyBaseLogger {
    this.made ??= this.parent.child(this.bindings, this.options)
    return this.made
  }
}

/** Fastify's childLoggerFactory: a LazyRequestLogger per request instead of a pino child. */
export function lazyRequestLogger (logger: FastifyBaseLogger, bindings: Bindings, options: ChildLoggerOptions): FastifyBaseLogger {
  return new LazyRequestLogger(logger as Logger, bindings, options)
}
