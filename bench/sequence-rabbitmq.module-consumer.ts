/**
 * The module consumer (b) of bench:sequence: SequenceModule over RabbitMqTransport (or
 * NatsTransport) and RedisSequenceStore, a @SequencedHandler reading payload.stream() to the end. Loaded by
 * sequence-rabbitmq.consumer.ts in module mode only.
 *
 * The store is wrapped to time accept, the reads and finish, the Redis client to count commands
 * (sequence-rabbitmq.traced-store.ts), and the transport to note the prefetch the module
 * subscribes with. None of the wrappers changes what it wraps does.
 */
import 'reflect-metadata';
import { Injectable, Logger, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import {
  ReassembledPayload,
  SequenceModule,
  SequencedHandler,
  type Transport,
} from 'nest-sequence';
import type { MessageHandler, SubscribeOptions, Subscription } from 'nest-sequence/ports';
import { NatsTransport } from 'nest-sequence/nats';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { RedisSequenceStore } from 'nest-sequence/redis';
import { nestLogger } from './harness/nest-logger';
import type { Consumer, Run } from './sequence-rabbitmq.consumer';
import type { ConsumerConfig } from './sequence-rabbitmq.protocol';
import { TracedStore, TraceRecorder, traceRedisCommands } from './sequence-rabbitmq.traced-store';
import { registerBenchTracing } from './harness/tracing';

registerBenchTracing();

/**
 * A transport that hands every call to the broker's, keeping its name, and notes the prefetch
 * of each subscription: the prefetch the library chose for the handler's consumer.
 */
class PrefetchNotingTransport implements Transport {
  readonly name: string;
  readonly maxMessageBytes: number;
  readonly partitioned?: boolean;
  readonly prefetchOf = new Map<string, number | undefined>();

  constructor(private readonly inner: Transport) {
    this.name = inner.name;
    this.maxMessageBytes = inner.maxMessageBytes;
    this.partitioned = inner.partitioned;
  }

  publish(...args: Parameters<Transport['publish']>): Promise<void> {
    return this.inner.publish(...args);
  }
  subscribe(
    channel: string,
    handler: MessageHandler,
    options?: SubscribeOptions,
  ): Promise<Subscription> {
    // Broker-held: the partitions' prefetch (the window) is what the fragments meet.
    if (options?.partitions !== undefined || !this.prefetchOf.has(channel)) {
      this.prefetchOf.set(channel, options?.prefetch);
    }
    return this.inner.subscribe(channel, handler, options);
  }
  deadLetterChannel(channel: string): string {
    return this.inner.deadLetterChannel(channel);
  }
  ping(): Promise<void> {
    return this.inner.ping();
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}

export async function startModuleConsumer(
  config: ConsumerConfig,
  currentRun: () => Run | undefined,
): Promise<Consumer> {
  Logger.overrideLogger(nestLogger('consumer'));
  const broker =
    config.transport === 'nats'
      ? await NatsTransport.connect(
          { servers: config.url },
          { prefetch: config.prefetch, unsafeSocketTricks: config.unsafeSocketTricks },
        )
      : await RabbitMqTransport.connect(config.url, {
          prefetch: config.prefetch,
          unsafeSocketTricks: config.unsafeSocketTricks,
        });
  const transport = new PrefetchNotingTransport(broker);
  const client = new Redis(config.redisUrl);
  const store = new RedisSequenceStore(client, {
    prefix: config.redisPrefix,
    readAhead: config.readAhead,
    unsafeSocketTricks: config.unsafeSocketTricks,
    encryption: config.encryptionKey
      ? { keys: [{ id: 'bench', key: config.encryptionKey }] }
      : undefined,
  });
  const recorder = new TraceRecorder();
  traceRedisCommands(client, recorder);
  const traced = new TracedStore(store, recorder, (trace) => {
    const run = currentRun();
    // The ack goes out right after finish resolves: let it, then report.
    if (run) setImmediate(() => run.settle(trace));
  });

  @Injectable()
  class Drain {
    @SequencedHandler({ channel: config.queue })
    async consume(payload: ReassembledPayload): Promise<void> {
      recorder.handlerStarted();
      let bytes = 0;
      for await (const chunk of payload.stream()) bytes += (chunk as Buffer).length;
      const run = currentRun();
      if (!run) throw new Error('a sequence completed outside a run');
      if (bytes !== run.bytes) {
        throw new Error(`handler read ${bytes} bytes, the run sent ${run.bytes}`);
      }
      run.done(bytes);
    }
  }

  @Module({
    imports: [
      SequenceModule.forRoot({
        transport,
        sequence: {
          store: traced,
          buffer: config.buffer,
          partitions: config.partitions,
          window: config.window,
        },
        prefetch: config.prefetch,
      }),
    ],
    providers: [Drain],
  })
  class ConsumerModule {}

  const app = await NestFactory.createApplicationContext(ConsumerModule, {
    logger: nestLogger('consumer'),
  });
  const prefetch = transport.prefetchOf.get(config.queue);
  if (prefetch === undefined) throw new Error(`no @SequencedHandler subscribed to ${config.queue}`);
  return {
    prefetch,
    arm: () => recorder.reset(),
    stop: async () => {
      await app.close();
      await broker.close();
      await store.close();
      await client.quit().catch(() => client.disconnect());
    },
  };
}
