import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { SERVERS } from '../../support/servers';
import { AMQP_URL, namedConnection, RabbitMqAdmin } from './rabbitmq.admin';
import { deleteUnder, newPrefix } from './redis.admin';

/** What `useFaultServers` connected, and the current test's key prefix. */
export interface FaultServers {
  readonly admin: RabbitMqAdmin;
  readonly redis: Redis;
  /** Only with `{ producer: true }`. */
  readonly producer: RabbitMqTransport;
  /** Fresh for each test; its keys are deleted after it. */
  readonly prefix: string;
}

export interface FaultServersOptions {
  /** Also connect a RabbitMqTransport to publish with (a named connection of its own). */
  readonly producer?: boolean;
  /**
   * Runs after each test, before its queues and keys are deleted: close the apps, kill the
   * processes that use them.
   */
  readonly beforeCleanup?: () => Promise<void>;
}

/**
 * Registers the hooks the fault tests share in the calling describe block: connects a
 * RabbitMqAdmin and a Redis client before all tests, gives each test a fresh key prefix, deletes
 * the test's queues and keys after it, and closes everything after all tests. Call it before the
 * block's own hooks: jest runs hooks of one block in the order they were registered.
 */
export function useFaultServers(options: FaultServersOptions = {}): FaultServers {
  let admin: RabbitMqAdmin | undefined;
  let redis: Redis | undefined;
  let producer: RabbitMqTransport | undefined;
  let prefix: string | undefined;

  beforeAll(async () => {
    admin = await RabbitMqAdmin.connect();
    redis = new Redis(SERVERS.redis.url);
    if (options.producer) {
      producer = await RabbitMqTransport.connect(
        AMQP_URL,
        {},
        namedConnection(`nseq-fault-producer-${randomUUID()}`),
      );
    }
  });

  beforeEach(() => {
    prefix = newPrefix();
  });

  afterEach(async () => {
    await options.beforeCleanup?.();
    await admin!.cleanup();
    await deleteUnder(redis!, prefix!);
  });

  afterAll(async () => {
    await producer?.close();
    await admin!.close();
    await redis!.quit();
  });

  const connected = <T>(value: T | undefined, what: string): T => {
    if (value === undefined) throw new Error(`useFaultServers: no ${what} (yet)`);
    return value;
  };
  return {
    get admin() {
      return connected(admin, 'RabbitMqAdmin');
    },
    get redis() {
      return connected(redis, 'Redis client');
    },
    get producer() {
      return connected(producer, 'producer: pass { producer: true }');
    },
    get prefix() {
      return connected(prefix, 'prefix outside a test');
    },
  };
}
