import { Inject, Module, type OnApplicationShutdown } from '@nestjs/common';
import { Registry } from 'prom-client';
import { FilesystemPayloadStore, type PayloadStore, type Transport } from 'nest-sequence';
import { NatsTransport } from 'nest-sequence/nats';
import type { StoreSet } from 'nest-sequence/ports';
import { postgres } from 'nest-sequence/postgres';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { redis } from 'nest-sequence/redis';
import { readDemoEnvironment, type DemoBroker } from './demo.environment';

/** The adapters the environment asks for; what is left out runs on the embedded default. */
export interface DemoAdapters {
  transport?: Transport;
  /**
   * The backends' stores, each over one connection: Redis (sequences, resequencing, claims and
   * parked studies) and PostgreSQL (the orders demo's outbox). The module closes them.
   */
  stores: StoreSet[];
  /** Where studies are parked when `PAYLOAD_DIR` says (else Redis's, or the embedded default). */
  payloadStore?: PayloadStore;
}

/** The outbox tables' prefix when `OUTBOX_TABLE_PREFIX` is unset (or empty): the orders demo's. */
export const DEFAULT_OUTBOX_TABLE_PREFIX = 'orders_demo_';

/** `OUTBOX_TABLE_PREFIX`, or its default. */
export function outboxTablePrefix(env: NodeJS.ProcessEnv = process.env): string {
  return env.OUTBOX_TABLE_PREFIX || DEFAULT_OUTBOX_TABLE_PREFIX;
}

export const DEMO_ADAPTERS = Symbol('demo:adapters');
/** The prom-client registry the module's metrics go to (the demos read their counters from it). */
export const DEMO_METRICS = Symbol('demo:metrics');

/**
 * - `AMQP_URL` set: RabbitMQ transport; `NATS_URL` set: NATS JetStream transport (not both).
 * - `REDIS_URL` set: every Redis store over one connection (`redis()`): sequences, resequencing,
 *   claims and, unless `PAYLOAD_DIR` is set, parked studies, all under the key prefix
 *   `SEQUENCE_REDIS_PREFIX` (default `nseq`), so that several consumer instances share them.
 * - `PAYLOAD_DIR` set: the filesystem payload store rooted there (with several processes, a
 *   directory they all see).
 * - `DATABASE_URL` set: the PostgreSQL outbox store, its tables named `OUTBOX_TABLE_PREFIX` +
 *   box (default `orders_demo_`). Its pool connects on first use: only the orders demo uses it.
 * Unset: the embedded defaults, no server needed (payloads under `<os tmpdir>/nest-sequence-payloads`).
 */
export async function adaptersFromEnvironment(env = process.env): Promise<DemoAdapters> {
  const stores: StoreSet[] = [];
  // First: it checks its options, and throws before any connection is opened.
  if (env.DATABASE_URL) {
    stores.push(postgres(env.DATABASE_URL, { tablePrefix: outboxTablePrefix(env) }));
  }
  const { broker } = readDemoEnvironment(env);
  const transport = broker && (await connectBroker(broker));
  const payloadStore = env.PAYLOAD_DIR
    ? new FilesystemPayloadStore({ root: env.PAYLOAD_DIR })
    : undefined;
  if (env.REDIS_URL) {
    stores.push(
      redis(env.REDIS_URL, {
        prefix: env.SEQUENCE_REDIS_PREFIX || undefined,
        payloadStore: payloadStore ? false : undefined,
      }),
    );
  }
  return { transport, stores, payloadStore };
}

function connectBroker(broker: DemoBroker): Promise<Transport> {
  switch (broker.kind) {
    case 'rabbitmq':
      return RabbitMqTransport.connect(broker.url);
    case 'nats':
      return NatsTransport.connect({ servers: broker.url });
  }
}

/**
 * Creates the adapters, and closes the transport with the application (`SequenceModule` closes the
 * stores sets and the defaults it made itself). Its consumers and sweepers stop before shutdown
 * hooks run, so nothing is mid-use.
 */
@Module({
  providers: [
    { provide: DEMO_ADAPTERS, useFactory: () => adaptersFromEnvironment() },
    { provide: DEMO_METRICS, useFactory: () => new Registry() },
  ],
  exports: [DEMO_ADAPTERS, DEMO_METRICS],
})
export class InfrastructureModule implements OnApplicationShutdown {
  constructor(@Inject(DEMO_ADAPTERS) private readonly adapters: DemoAdapters) {}

  async onApplicationShutdown(): Promise<void> {
    await this.adapters.transport?.close();
    await this.adapters.payloadStore?.close();
  }
}
