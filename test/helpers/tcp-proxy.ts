import net from 'node:net'

/*
 * A TCP proxy in front of PostgreSQL that a test controls: it can move to
 * another server (a failover repoint), go down and come back (a network
 * outage), and let a test act on what the service sends (hold a statement,
 * or cut the connection right after a COMMIT reached the server).
 */

export interface Target { host: string, port: number }

/** One proxied connection: the service's side and the server's side. */
export interface ProxiedConnection { client: net.Socket, server: net.Socket }

/**
 * Sees every chunk the service sends before it is forwarded. Return true when
 * the hook took care of the chunk itself (held it, forwarded it, dropped it).
 */
export type ClientDataHook = (chunk: Buffer, connection: ProxiedConnection) => boolean

export class TcpProxy {
  /** Connections open now. */
  readonly connections = new Set<ProxiedConnection>()
  onClientData: ClientDataHook | undefined
  private refusing = false

  private readonly server = net.createServer(client => { this.accept(client) })

  private constructor (public target: Target) {}

  /** Listens on 127.0.0.1 (on `port`, or a free one) and forwards to `target`. */
  static async start (target: Target, port = 0): Promise<TcpProxy> {
    const proxy = new TcpProxy(target)
    await new Promise<void>((resolve, reject) => {
      proxy.server.once('error', reject)
      proxy.server.listen(port, '127.0.0.1', () => { resolve() })
    })
    return proxy
  }

  get port (): number { return (this.server.address() as net.AddressInfo).port }

  /** `databaseUrl` with its host and port replaced by the proxy's. */
  url (databaseUrl: string): string {
    const url = new URL(databaseUrl)
    url.hostname = '127.0.0.1'
    url.port = String(this.port)
    return url.toString()
  }

  /**
   * Sends new connections to `target`. By default every open one is cut, as a
   * balancer with shutdown-sessions (or the old server's death) does; with
   * `cutOpen: false` they stay on the old server, as after a DNS change.
   */
  repoint (target: Target, { cutOpen = true } = {}): void {
    this.target = target
    if (cutOpen) this.cutAll()
  }

  /** Cuts every open connection and refuses new ones until `restore()`. */
  down (): void {
    this.refusing = true
    this.cutAll()
  }

  restore (): void { this.refusing = false }

  cutAll (): void {
    for (const { client, server } of this.connections) {
      client.destroy()
      server.destroy()
    }
    this.connections.clear()
  }

  async close (): Promise<void> {
    this.cutAll()
    await new Promise<void>(resolve => { this.server.close(() => { resolve() }) })
  }

  private accept (client: net.Socket): void {
    if (this.refusing) {
      client.destroy()
      return
    }
    const server = net.connect(this.target.port, this.target.host)
    const connection: ProxiedConnection = { client, server }
    this.connections.add(connection)
    const close = (): void => {
      this.connections.delete(connection)
      client.destroy()
      server.destroy()
    }
    client.on('error', close).on('close', close)
    server.on('error', close).on('close', close)
    server.on('data', chunk => { client.write(chunk) })
    client.on('data', (chunk: Buffer) => {
      if (this.onClientData?.(chunk, connection) === true) return
      server.write(chunk)
    })
  }
}
