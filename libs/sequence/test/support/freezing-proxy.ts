import { createServer, connect, type AddressInfo, type Server, type Socket } from 'node:net';
import { Redis } from 'ioredis';

/** What the proxy's connections share: whether it is frozen, and the sockets open. */
interface ProxyState {
  frozen: boolean;
  /** Only what the server sends is held back: requests still reach it. */
  repliesFrozen: boolean;
  readonly sockets: Set<Socket>;
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
    const state: ProxyState = { frozen: false, repliesFrozen: false, sockets: new Set() };
    const server = createServer((client) => {
      const upstream = connect(target.port, target.host);
      for (const [from, to] of [
        [client, upstream],
        [upstream, client],
      ] as const) {
        state.sockets.add(from);
        from.on('data', (chunk) => {
          if (!state.frozen && !(from === upstream && state.repliesFrozen)) to.write(chunk);
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
