import { InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace'
import { startTelemetry } from '../../src/telemetry.js'

/**
 * Tracing with the SDK's in-memory exporter in place of OTLP, shut down with the test. Call it before importing the
 * app's helpers (dynamically): as `node --import ./dist/telemetry.js` does, it must start before pg and ioredis load.
 */
export async function traceInMemory (
  t: { teardown: (fn: () => Promise<void>) => void }
): Promise<InMemorySpanExporter> {
  const exporter = new InMemorySpanExporter()
  const telemetry = await startTelemetry({ spanProcessors: [new SimpleSpanProcessor({ exporter })] })
  t.teardown(async () => {
    await telemetry.shutdown()
  })
  return exporter
}
