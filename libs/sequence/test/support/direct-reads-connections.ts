import type { Redis } from 'ioredis';
import { DIRECT_READS_CONNECTION_NAME } from '../../src/adapters/stores/redis/redis-direct-reads';

/**
 * The `CLIENT LIST` lines of the connections a store opened for direct reads on a client named
 * `clientName` (they are named `<clientName>-nest-sequence-reads`), as `admin` sees them.
 */
export async function directReadsConnections(admin: Redis, clientName: string): Promise<string[]> {
  const name = `${clientName}-${DIRECT_READS_CONNECTION_NAME}`;
  return String(await admin.client('LIST'))
    .split('\n')
    .filter((line) => line.includes(` name=${name} `));
}

/** Kills the first of those connections from the server's side; how many it killed (0 or 1). */
export async function killDirectReadsConnection(admin: Redis, clientName: string): Promise<number> {
  const [line] = await directReadsConnections(admin, clientName);
  const address = line === undefined ? undefined : / addr=(\S+) /.exec(line)?.[1];
  if (address === undefined) return 0;
  return Number(await admin.client('KILL', 'ADDR', address));
}
