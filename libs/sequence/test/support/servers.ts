import { spawnSync } from 'node:child_process';

/** Loopback servers the integration tests use; URLs from the environment, local defaults. */
export const SERVERS = {
  rabbitmq: { url: process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672', port: 5672 },
  redis: { url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', port: 6379 },
  nats: { url: process.env.NATS_URL ?? 'nats://127.0.0.1:4222', port: 4222 },
  postgres: {
    url: process.env.DATABASE_URL ?? 'postgres://postgres:postgres@127.0.0.1:5432/test',
    port: 5432,
  },
} as const;

export type ServerName = keyof typeof SERVERS;

const reachability = new Map<ServerName, boolean>();

/** Whether the server accepts a TCP connection (checked once, synchronously, at load time). */
export function isReachable(server: ServerName): boolean {
  let known = reachability.get(server);
  if (known === undefined) {
    const { hostname, port } = new URL(SERVERS[server].url);
    const probe = spawnSync(
      process.execPath,
      [
        '-e',
        `const s=require('net').connect(${Number(port) || SERVERS[server].port},${JSON.stringify(
          hostname || '127.0.0.1',
        )});s.on('connect',()=>process.exit(0));s.on('error',()=>process.exit(1));setTimeout(()=>process.exit(1),2000);`,
      ],
      { timeout: 5000 },
    );
    known = probe.status === 0;
    reachability.set(server, known);
  }
  return known;
}

/**
 * `describe` for tests that need a real server. When the server does not answer: under CI
 * (`CI=true`) the block fails with a message naming the server; elsewhere it is skipped with a
 * warning. Integration tests never skip silently in CI.
 */
export function describeWithServer(server: ServerName, name: string, body: () => void): void {
  if (isReachable(server)) {
    describe(name, body);
    return;
  }
  const message = `${server} is not reachable at ${SERVERS[server].url}; start it (see DEVELOPERS.md) or set the URL`;
  if (process.env.CI === 'true' || process.env.CI === '1') {
    describe(name, () => {
      it(`needs ${server}`, () => {
        throw new Error(message);
      });
    });
    return;
  }
  console.warn(`skipping "${name}": ${message}`);
  describe.skip(name, body);
}
