import { randomUUID } from 'node:crypto';
import { type RabbitMqTransportOptions } from 'nest-sequence/rabbitmq';
import { RedisSequenceStore } from 'nest-sequence/redis';
import { type SequenceStore, type Transport } from 'nest-sequence';
import type { RedisOptions } from 'ioredis';
import { SERVERS } from '../../support/servers';
import { createSequenceTestApp, type SequenceTestApp } from '../../support/sequence-test-app';
import { namedTransport } from '../../support/rabbitmq.fixture';
import { closeAll, type Closer } from '../../support/test-app';
import type { TransportCase } from '../../support/transports.fixture';

export interface RealServersApp extends Omit<SequenceTestApp, 'transport'> {
  readonly transport: Transport;
  /** The name the broker lists this instance's connection under (client property `connection_name`). */
  readonly connectionName: string;
}

type TestAppOptions = NonNullable<Parameters<typeof createSequenceTestApp>[1]>;

/**
 * {@link createSequenceTestApp} on the real servers: a Nest application with its own RabbitMQ
 * (or `on`'s broker) connection, named so that a test can have the broker drop exactly this one,
 * and its own Redis client under `prefix` (or the `store` given). `close()` closes the
 * application, then the transport and store it made, each even if another fails.
 */
export async function createRealServersApp(
  channel: string,
  options: Omit<TestAppOptions, 'transport' | 'store'> & {
    prefix: string;
    store?: SequenceStore;
    /** Wraps the Redis store this app makes (e.g. to count what this instance stored). */
    wrapStore?: (store: RedisSequenceStore) => SequenceStore;
    redisUrl?: string;
    redis?: RedisOptions;
    keyTtlMarginMs?: number;
    /** The broker. @default RabbitMQ, with `rabbitmq` and `reconnectSeconds` */
    on?: TransportCase;
    rabbitmq?: RabbitMqTransportOptions;
    reconnectSeconds?: number;
  },
): Promise<RealServersApp> {
  const {
    prefix,
    store: givenStore,
    wrapStore = (store: RedisSequenceStore): SequenceStore => store,
    redisUrl = SERVERS.redis.url,
    redis,
    keyTtlMarginMs,
    on,
    rabbitmq,
    reconnectSeconds,
    ...appOptions
  } = options;
  const connectionName = `nseq-fault-${randomUUID()}`;
  const transport: Transport = on
    ? await on.connect(connectionName)
    : await namedTransport(connectionName, { transport: rabbitmq, reconnectSeconds });
  const store =
    givenStore ??
    wrapStore(RedisSequenceStore.connect(redisUrl, { prefix, keyTtlMarginMs, redis }));
  // Closed last first: the transport, then the store this app made.
  const resources: Closer[] = [
    ...(givenStore ? [] : [() => store.close()]),
    () => transport.close(),
  ];
  let app: SequenceTestApp;
  try {
    app = await createSequenceTestApp(channel, {
      ...appOptions,
      transport,
      sequence: { ...appOptions.sequence, store },
    });
  } catch (error) {
    await closeAll(resources);
    throw error;
  }
  return {
    ...app,
    transport,
    connectionName,
    close: () => closeAll([...resources, () => app.close()]),
  };
}
