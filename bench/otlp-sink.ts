import { createServer } from 'node:http'

/*
 * An OTLP/HTTP receiver that accepts and drops every export, for measuring tracing's cost
 * in the service (bench/README.md, "Tracing on against off"): OTLP_SINK_PORT, default 4318.
 */
const port = Number(process.env.OTLP_SINK_PORT ?? 4318)
let requests = 0
let bytes = 0
createServer((req, res) => {
  req.on('data', (chunk: Buffer) => { bytes += chunk.length })
  req.on('end', () => {
    requests++
    res.writeHead(200, { 'content-type': req.headers['content-type'] ?? 'application/x-protobuf' }).end()
  })
}).listen(port, '127.0.0.1', () => { console.log(`otlp-sink: listening on 127.0.0.1:${port}`) })
process.on('SIGTERM', () => {
  console.log(`otlp-sink: ${requests} exports, ${bytes} bytes`)
  process.exit(0)
})
