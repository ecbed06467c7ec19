import type { Cluster, Redis, RedisOptions } from 'ioredis';
import type { RedisClient } from './redis-scripts';
import { closeOrDrop } from '../../../core/async';
import { refuseUnknownKeys, type Renames } from '../../../core/option-keys';

/**
 * A new ioredis client for `url`, for an adapter's `connect()` (which then owns it). ioredis is
 * loaded here, not at the top of a module: it is an optional peer of the library.
 */
export function newRedisClient(url: string, options: RedisOptions = {}): Redis {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { Redis: Client } = require('ioredis') as typeof import('ioredis');
  return new Client(url, options);
}

/**
 * For an adapter's `connect(url, options)`: refuses a key of `options` that is neither one of
 * `keys` nor `redis` (ioredis's own options, not checked here) before opening anything, opens a
 * client with `redis`, and builds the adapter on it with its own options. A client whose adapter
 * refuses its options is disconnected: else it would stay, connected or reconnecting, for the
 * life of the process, with nobody to close it.
 */
export function connectOwned<T extends { readonly redis?: RedisOptions }, A>(
  url: string,
  options: T,
  where: string,
  keys: object,
  build: (client: Redis, own: Omit<T, 'redis'>) => A,
  renames?: Renames,
): A {
  refuseUnknownKeys(where, options, { ...keys, redis: true }, renames);
  const { redis, ...own } = options;
  const client = newRedisClient(url, redis);
  try {
    return build(client, own);
  } catch (error) {
    client.disconnect();
    throw error;
  }
}

/**
 * Quits a client an adapter owns; one that is not connected just drops its connection attempts,
 * and so does one whose server does not answer QUIT within 2 s (see closeOrDrop).
 */
export async function quitRedisClient(
  client: Pick<RedisClient, 'quit' | 'disconnect'>,
): Promise<void> {
  await closeOrDrop(
    () => client.quit(),
    () => client.disconnect(),
  );
}

/** Whether `client` is an ioredis `Cluster` (which sets `isCluster`), not a single node's client. */
export function isCluster(client: RedisClient): client is Cluster {
  return (client as { isCluster?: boolean }).isCluster === true;
}
