import { randomBytes } from 'node:crypto';
import { createServer, connect, type Server, type Socket } from 'node:net';
import { record } from '../../../testing/conformance/outbox-store/outbox-suite.context';
import { FreezingProxy } from '../../../../test/support/freezing-proxy';
import { adminQuery } from '../../../../test/support/postgres.fixture';
import { eventually } from '../../../../test/support/sequence-test-app';
import { SERVERS, describeWithServer } from '../../../../test/support/servers';
import { BOX_NAMES, type BoxName } from '../../../ports/outbox-store.port';
import { PostgresOutboxStore } from './postgres.outbox-store';

const URL = SERVERS.postgres.url;

describeWithServer('postgres', 'PostgresOutboxStore.watch (LISTEN connection)', () => {
  let tablePrefix: string;
  let store: PostgresOutboxStore;

  beforeEach(async () => {
    tablePrefix = `w${randomBytes(5).toString('hex')}_`;
    store = PostgresOutboxStore.connect(URL, { tablePrefix, listenBackoffMs: 20 });
    await store.migrate();
  });

  afterEach(async () => {
    await store.close();
    const tables = [...BOX_NAMES, 'outbox_migrations'].map((name) => `${tablePrefix}${name}`);
    await adminQuery(`DROP TABLE IF EXISTS ${tables.join(', ')}`);
  });

  /** The server processes of the store's LISTEN connection. */
  async function listenerPids(of: PostgresOutboxStore = store): Promise<number[]> {
    const name = of.listenerApplicationName;
    if (name === undefined) return [];
    const rows = await adminQuery<{ pid: number }>(
      'SELECT pid FROM pg_stat_activity WHERE application_name = $1',
      [name],
    );
    return rows.map((row) => row.pid);
  }

  it('listens on one connection of its own, named after the channel', async () => {
    const unsubscribe = await store.watch(() => undefined);
    expect(store.listenerApplicationName).toContain(store.notifyChannel);
    await expect(listenerPids()).resolves.toHaveLength(1);
    const channels = await adminQuery<{ channel: string }>(
      // Only the listening session itself can read pg_listening_channels(); the activity's
      // last query is what the others can see.
      'SELECT query AS channel FROM pg_stat_activity WHERE application_name = $1',
      [store.listenerApplicationName],
    );
    expect(channels[0].channel).toBe(`LISTEN "${store.notifyChannel}"`);
    await unsubscribe();
  });

  it('closes the connection when the last listener unsubscribes, and opens one again after', async () => {
    const first = await store.watch(() => undefined);
    const second = await store.watch(() => undefined);
    const [pid] = await listenerPids();
    await first();
    await expect(listenerPids()).resolves.toEqual([pid]);
    await second();
    await eventually(async () => (await listenerPids()).length === 0, 'the connection to close');

    const woken: BoxName[] = [];
    const again = await store.watch((box) => woken.push(box));
    await store.transaction((tx) => store.append('inbox_events', [record('a')], tx));
    await eventually(() => woken.includes('inbox_events'), 'a wake-up after subscribing again');
    await again();
  });

  it('reconnects after its connection is killed, wakes every box once, and hears appends again', async () => {
    const woken: BoxName[] = [];
    const unsubscribe = await store.watch((box) => woken.push(box));
    const [killed] = await listenerPids();

    await adminQuery('SELECT pg_terminate_backend($1)', [killed]);
    await eventually(() => BOX_NAMES.every((box) => woken.includes(box)), 'every box to be woken');
    const [reconnected] = await listenerPids();
    expect(reconnected).toBeDefined();
    expect(reconnected).not.toBe(killed);
    expect(woken.filter((box) => box === 'outbox_commands')).toHaveLength(1);

    woken.length = 0;
    await store.transaction((tx) => store.append('outbox_commands', [record('after')], tx));
    await eventually(() => woken.includes('outbox_commands'), 'a wake-up after the reconnect');
    await unsubscribe();
  });

  it('keeps reconnecting when its connection is killed again and again', async () => {
    const woken: BoxName[] = [];
    const unsubscribe = await store.watch((box) => woken.push(box));
    // Kill it repeatedly: each reconnect may itself be killed; the listener must not give up.
    for (let round = 0; round < 3; round++) {
      const pids = await listenerPids();
      if (pids.length > 0) await adminQuery('SELECT pg_terminate_backend($1)', [pids[0]]);
      await new Promise((resolve) => setTimeout(resolve, 30));
    }
    await eventually(async () => (await listenerPids()).length === 1, 'the listener to reconnect');
    woken.length = 0;
    await store.transaction((tx) => store.append('outbox_events', [record('x')], tx));
    await eventually(() => woken.includes('outbox_events'), 'a wake-up after the reconnects');
    await unsubscribe();
  });

  it('keeps trying while the server refuses connections, and listens again once it is back', async () => {
    const proxy = new TcpProxy(new globalThis.URL(URL));
    const port = await proxy.open();
    const proxied = new globalThis.URL(URL);
    proxied.port = String(port);
    const behindProxy = PostgresOutboxStore.connect(URL, {
      tablePrefix,
      listenConnection: proxied.toString(),
      listenBackoffMs: 20,
      listenMaxBackoffMs: 100,
    });
    try {
      const woken: BoxName[] = [];
      await behindProxy.watch((box) => woken.push(box));
      await expect(listenerPids(behindProxy)).resolves.toHaveLength(1);
      await proxy.close();
      // Refused for a while (several attempts, 20 to 100 ms apart): no LISTEN connection.
      await new Promise((resolve) => setTimeout(resolve, 400));
      expect(behindProxy.listenerApplicationName).toBeDefined();
      await expect(listenerPids(behindProxy)).resolves.toEqual([]);
      await proxy.open(port);
      await eventually(() => BOX_NAMES.every((box) => woken.includes(box)), 'the reconnect');
      woken.length = 0;
      await behindProxy.transaction((tx) => behindProxy.append('outbox_events', [record('p')], tx));
      await eventually(() => woken.includes('outbox_events'), 'a wake-up through the proxy');
    } finally {
      await behindProxy.close();
      await proxy.close();
    }
  });

  it('drops its connection when the server stops answering as it ends it, instead of waiting', async () => {
    const { proxy, url } = await FreezingProxy.toUrl(URL, 5432);
    const behindProxy = PostgresOutboxStore.connect(URL, { tablePrefix, listenConnection: url });
    try {
      const unsubscribe = await behindProxy.watch(() => undefined);
      await eventually(
        () => proxy.clientsConnected === 1,
        'the LISTEN connection through the proxy',
      );
      proxy.freeze();
      const startedAt = Date.now();

      await unsubscribe();

      expect(Date.now() - startedAt).toBeLessThan(5_000);
      await eventually(() => proxy.clientsConnected === 0, 'the LISTEN connection dropped');
    } finally {
      await behindProxy.close();
      await proxy.close();
    }
  });

  it('stops listening on close', async () => {
    await store.watch(() => undefined);
    await expect(listenerPids()).resolves.toHaveLength(1);
    await store.close();
    await eventually(async () => (await listenerPids()).length === 0, 'the connection to close');
  });

  it('rejects watch when it cannot connect, and leaves the store usable', async () => {
    const unreachable = PostgresOutboxStore.connect(URL, {
      tablePrefix,
      listenConnection: 'postgres://postgres@127.0.0.1:1/test',
    });
    try {
      await expect(unreachable.watch(() => undefined)).rejects.toThrow();
      await expect(unreachable.ping()).resolves.toBeUndefined();
      // A later watch tries again rather than reusing the failed attempt.
      await expect(unreachable.watch(() => undefined)).rejects.toThrow();
    } finally {
      await unreachable.close();
    }
  });

  it('does not let one throwing listener keep a wake-up from the others', async () => {
    const woken: BoxName[] = [];
    const throwing = await store.watch(() => {
      throw new Error('listener bug');
    });
    const listening = await store.watch((box) => woken.push(box));
    await store.transaction((tx) => store.append('outbox_events', [record('a')], tx));
    await eventually(() => woken.includes('outbox_events'), 'the second listener');
    await throwing();
    await listening();
  });
});

/** A TCP forwarder to the server that can be shut (dropping its connections) and opened again. */
class TcpProxy {
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();

  constructor(private readonly target: URL) {}

  open(port = 0): Promise<number> {
    const server = createServer((incoming) => {
      const outgoing = connect(Number(this.target.port) || 5432, this.target.hostname);
      for (const socket of [incoming, outgoing]) {
        this.sockets.add(socket);
        socket.on('close', () => this.sockets.delete(socket));
        socket.on('error', () => undefined);
      }
      incoming.pipe(outgoing).pipe(incoming);
    });
    this.server = server;
    return new Promise((resolve) =>
      server.listen(port, '127.0.0.1', () => resolve((server.address() as { port: number }).port)),
    );
  }

  async close(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    if (!server) return;
    for (const socket of this.sockets) socket.destroy();
    await new Promise((resolve) => server.close(resolve));
  }
}
