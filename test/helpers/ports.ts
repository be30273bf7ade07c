import { createServer } from 'node:net'

/** A loopback port that was free a moment ago (nothing listens there now). For tests' own servers, proxies and
 * addresses nobody answers. */
export async function freePort (): Promise<number> {
  return await new Promise((resolve, reject) => {
    const server = createServer()
    server.unref()
    server.on('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const address = server.address()
      server.close(() => {
        if (typeof address === 'object' && address !== null) resolve(address.port)
        else reject(new Error('no free port'))
      })
    })
  })
}
