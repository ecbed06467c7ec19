import { Inject, Module, type OnApplicationShutdown } from '@nestjs/common';
import {
  RabbitMqTransport,
  RedisSequenceStore,
  type SequenceStore,
  type Transport,
} from 'nest-sequence';

/** The adapters the environment asks for; what is left out runs on the embedded default. */
export interface DemoAdapters {
  transport?: Transport;
  store?: SequenceStore;
}

export const DEMO_ADAPTERS = Symbol('demo:adapters');

/**
 * `AMQP_URL` set: RabbitMQ transport. `REDIS_URL` set: Redis sequence store, under the key prefix
 * `SEQUENCE_REDIS_PREFIX` (default `nseq`). Unset: the in-memory defaults, no server needed.
 */
export async function adaptersFromEnvironment(env = process.env): Promise<DemoAdapters> {
  const transport = env.AMQP_URL ? await RabbitMqTransport.connect(env.AMQP_URL) : undefined;
  const store = env.REDIS_URL
    ? RedisSequenceStore.connect(env.REDIS_URL, { prefix: env.SEQUENCE_REDIS_PREFIX || undefined })
    : undefined;
  return { transport, store };
}

/**
 * Creates the adapters and closes them with the application: `SequenceModule` closes only the
 * defaults it made itself. Its consumers stop before shutdown hooks run, so nothing is mid-use.
 */
@Module({
  providers: [{ provide: DEMO_ADAPTERS, useFactory: () => adaptersFromEnvironment() }],
  exports: [DEMO_ADAPTERS],
})
export class InfrastructureModule implements OnApplicationShutdown {
  constructor(@Inject(DEMO_ADAPTERS) private readonly adapters: DemoAdapters) {}

  async onApplicationShutdown(): Promise<void> {
    await this.adapters.transport?.close();
    await this.adapters.store?.close();
  }
}
