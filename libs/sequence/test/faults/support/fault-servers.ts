import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { namedTransport, type RabbitMqAdmin, useRabbitMq } from '../../support/rabbitmq.fixture';
import { useRedis } from '../../support/redis.fixture';

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
 * Registers the hooks the fault tests share in the calling describe block ({@link useRabbitMq}
 * and {@link useRedis}, prefixes `nseq-fault:<uuid>`): connects a
 * RabbitMqAdmin and a Redis client before all tests, gives each test a fresh key prefix, deletes
 * the test's queues and keys after it, and closes everything after all tests. Call it before the
 * block's own hooks: jest runs hooks of one block in the order they were registered.
 */
export function useFaultServers(options: FaultServersOptions = {}): FaultServers {
  const rabbitmq = useRabbitMq({ beforeCleanup: options.beforeCleanup });
  const redis = useRedis({ stem: 'nseq-fault' });
  let producer: RabbitMqTransport | undefined;

  beforeAll(async () => {
    if (options.producer) {
      producer = await namedTransport(`nseq-fault-producer-${randomUUID()}`);
    }
  });

  afterAll(async () => {
    await producer?.close();
  });

  return {
    get admin() {
      return rabbitmq.admin;
    },
    get redis() {
      return redis.client;
    },
    get producer() {
      if (!producer) throw new Error('useFaultServers: no producer: pass { producer: true }');
      return producer;
    },
    get prefix() {
      return redis.prefix;
    },
  };
}
