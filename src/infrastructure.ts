import { Inject, Module, type OnApplicationShutdown } from '@nestjs/common';
import { Registry } from 'prom-client';
import {
  FilesystemPayloadStore,
  type ClaimLedger,
  type OutboxStore,
  type PayloadStore,
  type ResequencerStore,
  type SequenceStore,
  type Transport,
} from 'nest-sequence';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import {
  RedisClaimLedger,
  RedisPayloadStore,
  RedisResequencerStore,
  RedisSequenceStore,
} from 'nest-sequence/redis';

/** The adapters the environment asks for; what is left out runs on the embedded default. */
export interface DemoAdapters {
  transport?: Transport;
  store?: SequenceStore;
  /** Where studies above CLAIM_CHECK_ABOVE_BYTES are parked. */
  payloadStore?: PayloadStore;
  /** Which tickets the AI service has handled: shared, so that several instances handle each once. */
  claimLedger?: ClaimLedger;
  /** Each transfer's resequencing state: shared, so that any instance may take any status. */
  resequencerStore?: ResequencerStore;
  /** The orders demo's outbox and inbox tables, and its business tables beside them. */
  outboxStore?: OutboxStore;
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
 * - `AMQP_URL` set: RabbitMQ transport.
 * - `REDIS_URL` set: Redis sequence store, claim ledger and resequencer store, and the Redis
 *   payload store unless `PAYLOAD_DIR` is set, all under the key prefix `SEQUENCE_REDIS_PREFIX`
 *   (default `nseq`), so that several consumer instances share them.
 * - `PAYLOAD_DIR` set: the filesystem payload store rooted there (with several processes, a
 *   directory they all see).
 * - `DATABASE_URL` set: the PostgreSQL outbox store, its tables named `OUTBOX_TABLE_PREFIX` +
 *   box (default `orders_demo_`). Its pool connects on first use: only the orders demo uses it.
 * Unset: the embedded defaults, no server needed (payloads under `<os tmpdir>/nest-sequence-payloads`).
 */
export async function adaptersFromEnvironment(env = process.env): Promise<DemoAdapters> {
  const prefix = env.SEQUENCE_REDIS_PREFIX || undefined;
  const redisUrl = env.REDIS_URL || undefined;
  // First: it checks its options, and throws before any connection is opened.
  const outboxStore = env.DATABASE_URL
    ? PostgresOutboxStore.connect(env.DATABASE_URL, { tablePrefix: outboxTablePrefix(env) })
    : undefined;
  const transport = env.AMQP_URL ? await RabbitMqTransport.connect(env.AMQP_URL) : undefined;
  const store = redisUrl ? RedisSequenceStore.connect(redisUrl, { prefix }) : undefined;
  let payloadStore: PayloadStore | undefined;
  if (env.PAYLOAD_DIR) payloadStore = new FilesystemPayloadStore({ root: env.PAYLOAD_DIR });
  else if (redisUrl) payloadStore = RedisPayloadStore.connect(redisUrl, { prefix });
  const claimLedger = redisUrl ? RedisClaimLedger.connect(redisUrl, { prefix }) : undefined;
  const resequencerStore = redisUrl
    ? RedisResequencerStore.connect(redisUrl, { prefix })
    : undefined;
  return { transport, store, payloadStore, claimLedger, resequencerStore, outboxStore };
}

/**
 * Creates the adapters and closes them with the application: `SequenceModule` closes only the
 * defaults it made itself. Its consumers and sweepers stop before shutdown hooks run, so nothing
 * is mid-use.
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
    const { transport, store, payloadStore, claimLedger, resequencerStore, outboxStore } =
      this.adapters;
    await transport?.close();
    await Promise.all([
      store?.close(),
      payloadStore?.close(),
      claimLedger?.close(),
      resequencerStore?.close(),
      outboxStore?.close(),
    ]);
  }
}
