import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { Transport } from 'nest-sequence';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import type { BrokerAdmin } from '../../support/broker-admin';
import { namedTransport, type RabbitMqAdmin, useRabbitMq } from '../../support/rabbitmq.fixture';
import { useRedis } from '../../support/redis.fixture';
import { useTransportAdmin, type TransportCase } from '../../support/transports.fixture';

/** What `useFaultServers` connected, and the current test's key prefix. */
export interface FaultServers<A extends BrokerAdmin = RabbitMqAdmin, P = RabbitMqTransport> {
  readonly admin: A;
  readonly redis: Redis;
  /** Only with `{ producer: true }`. */
  readonly producer: P;
  /** Fresh for each test; its keys are deleted after it. */
  readonly prefix: string;
}

export interface FaultServersOptions {
  /** Also connect a transport to publish with (a named connection of its own). */
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
  return faultServers(useRabbitMq(options), namedTransport, options);
}

/**
 * {@link useFaultServers} on the broker of `transport`: its {@link BrokerAdmin}, and a producer
 * of its transport.
 */
export function useFaultServersOn(
  transport: TransportCase,
  options: FaultServersOptions = {},
): FaultServers<BrokerAdmin, Transport> {
  return faultServers(
    useTransportAdmin(transport, options),
    (name) => transport.connect(name),
    options,
  );
}

function faultServers<A extends BrokerAdmin, P extends Transport>(
  broker: { readonly admin: A },
  connectProducer: (name: string) => Promise<P>,
  options: FaultServersOptions,
): FaultServers<A, P> {
  const redis = useRedis({ stem: 'nseq-fault' });
  let producer: P | undefined;

  beforeAll(async () => {
    if (options.producer) {
      producer = await connectProducer(`nseq-fault-producer-${randomUUID()}`);
    }
  });

  afterAll(async () => {
    await producer?.close();
  });

  return {
    get admin() {
      return broker.admin;
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
