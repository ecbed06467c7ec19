import { createServer, connect, type AddressInfo, type Server, type Socket } from 'node:net';
import { Redis } from 'ioredis';

/** What the proxy's connections share: whether it is frozen, and the sockets open. */
interface ProxyState {
  frozen: boolean;
  /** Only what the server sends is held back: requests still reach it. */
  repliesFrozen: boolean;
  readonly sockets: Set<Socket>;
  /** The client sides of the connections that the clients have not closed. */
  readonly clients: Set<Socket>;
}

/**
 * A TCP proxy on a loopback port to `target` that can freeze: its connections stay open and
 * nothing more passes either way, as with a frozen server or a network black hole (nothing is
 * refused or reset, so only timeouts notice).
 */
export class FreezingProxy {
  private constructor(
    private readonly server: Server,
    readonly port: number,
    private readonly state: ProxyState,
  ) {}

  static async start(target: { host: string; port: number }): Promise<FreezingProxy> {
    const state: ProxyState = {
      frozen: false,
      repliesFrozen: false,
      sockets: new Set(),
      clients: new Set(),
    };
    // Half-open allowed: a frozen server does not close its side when the client closes its own.
    const server = createServer({ allowHalfOpen: true }, (client) => {
      const upstream = connect({ port: target.port, host: target.host, allowHalfOpen: true });
      state.clients.add(client);
      for (const event of ['end', 'close']) client.on(event, () => state.clients.delete(client));
      for (const [from, to] of [
        [client, upstream],
        [upstream, client],
      ] as const) {
        state.sockets.add(from);
        from.on('data', (chunk) => {
          if (!state.frozen && !(from === upstream && state.repliesFrozen)) to.write(chunk);
        });
        from.on('end', () => {
          if (!state.frozen) to.end();
        });
        from.on('error', () => to.destroy());
        from.on('close', () => {
          state.sockets.delete(from);
          to.destroy();
        });
      }
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return new FreezingProxy(server, (server.address() as AddressInfo).port, state);
  }

  /**
   * A proxy to the server `url` names (its port, or `defaultPort`), and `url` pointed at the
   * proxy: the same credentials and database, through it.
   */
  static async toUrl(
    url: string,
    defaultPort: number,
  ): Promise<{ proxy: FreezingProxy; url: string }> {
    const server = new URL(url);
    const proxy = await FreezingProxy.start({
      host: server.hostname,
      port: Number(server.port || defaultPort),
    });
    server.hostname = '127.0.0.1';
    server.port = String(proxy.port);
    return { proxy, url: server.toString() };
  }

  /**
   * The connections whose client has not closed its side (a frozen server keeps its own open):
   * 0 once the clients let go of every connection. A client that only half-closes (sends its end
   * and waits for the server's) counts as gone: time that wait, too.
   */
  get clientsConnected(): number {
    return this.state.clients.size;
  }

  /** From now on nothing passes, either way; the connections stay open. */
  freeze(): void {
    this.state.frozen = true;
  }

  /**
   * From now on requests still reach the server, but nothing it answers comes back: a call
   * takes effect and its reply is lost.
   */
  freezeReplies(): void {
    this.state.repliesFrozen = true;
  }

  /** Drops every open connection and lets new ones through again, as a reset link does. */
  resume(): void {
    for (const socket of this.state.sockets) socket.destroy();
    this.state.frozen = false;
    this.state.repliesFrozen = false;
  }

  /** Closes every connection and stops listening. */
  async close(): Promise<void> {
    for (const socket of this.state.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

/**
 * A client of the Redis on loopback `port` whose connection goes through a new
 * {@link FreezingProxy}. Its commands wait through reconnects for ever (ioredis has no command
 * timeout of its own), so only the proxy decides when an answer comes.
 */
export async function redisThroughProxy(
  port: number,
): Promise<{ proxy: FreezingProxy; client: Redis }> {
  const proxy = await FreezingProxy.start({ host: '127.0.0.1', port });
  const client = new Redis({ host: '127.0.0.1', port: proxy.port, maxRetriesPerRequest: null });
  return { proxy, client };
}
