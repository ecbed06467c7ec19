import { randomUUID } from 'node:crypto';
import type { INestApplicationContext } from '@nestjs/common';
import type { Registry } from 'prom-client';
import { GapSweeper } from '../../../src/resequencer/gap.sweeper';
import { RedisResequencerStore } from 'nest-sequence/redis';
import {
  ResequencerService,
  type GapEvent,
  type ResequencerDefinition,
  type ResequencerStore,
  type Transport,
} from 'nest-sequence';
import { ModuleMetrics } from '../../../src/kernel/module-metrics';
import { type HeaderMap } from 'nest-sequence/wire';
import type { ResequencerOptions } from '../../../src/options/resequencer.options';
import {
  RecordingResequencedHandler,
  resequencedHandler,
} from '../../resequencer/resequencer-test-app';
import { redisClient } from '../../support/redis.fixture';
import { createTestApp } from '../../support/test-app';
import { namedTransport } from '../../support/rabbitmq.fixture';
import type { TransportCase } from '../../support/transports.fixture';

export interface ResequencerApp {
  readonly app: INestApplicationContext;
  readonly transport: Transport;
  /** The name the broker lists this instance's connection under (to have it dropped). */
  readonly connectionName: string;
  /** The Redis store this instance uses (its own client), e.g. to inspect a key. */
  readonly store: RedisResequencerStore;
  /** The recording `@Resequenced` handler (without a definition: a handler nothing calls). */
  readonly handler: RecordingResequencedHandler;
  readonly service: ResequencerService;
  readonly sweeper: GapSweeper;
  /** Every gap outcome this instance reported, in order. */
  readonly gaps: GapEvent[];
  readonly registry: Registry;
  close(): Promise<void>;
}

export interface ResequencerAppOptions {
  /** The Redis key prefix, shared by every instance of one test. */
  readonly prefix: string;
  /** Module-wide resequencer options (`store` is this app's Redis store). */
  readonly resequencer?: Omit<ResequencerOptions, 'store'>;
  /** How often the gap sweeper runs. @default false (tests sweep themselves) */
  readonly gapSweepIntervalMs?: number | false;
  /** The drain lease (the module's `tuning.leaseMs`). */
  readonly leaseMs?: number;
  /** @default 50 */
  readonly backpressureDelayMs?: number;
  /** Wraps the Redis store the module gets (e.g. to inject faults into this instance's calls). */
  readonly wrapStore?: (store: RedisResequencerStore) => ResequencerStore;
  /** The broker. @default RabbitMQ */
  readonly on?: TransportCase;
}

/**
 * A Nest application on the real servers with one `@Resequenced` handler (or none, for tests of
 * resequencers made with `service.create`): its own RabbitMQ (or `on`'s broker) connection, named
 * for the broker, and its own Redis client, under `prefix`, in a `RedisResequencerStore`. The gap
 * sweeper is off unless `gapSweepIntervalMs` says. `close()` closes the application, then the
 * transport and the Redis client.
 */
export async function createResequencerApp(
  definition: ResequencerDefinition | undefined,
  options: ResequencerAppOptions,
): Promise<ResequencerApp> {
  const connectionName = `nseq-fault-rsq-${randomUUID()}`;
  const transport = options.on
    ? await options.on.connect(connectionName)
    : await namedTransport(connectionName);
  const redis = redisClient();
  const store = new RedisResequencerStore(redis, { prefix: options.prefix });
  const Handler = definition && resequencedHandler(definition);
  const { app, close } = await createTestApp({
    sequence: {
      transport,
      // A short lease needs a confirm timeout that fits in it (see resolveResequencerDefinition).
      publish: options.leaseMs
        ? { confirmTimeoutMs: Math.floor(options.leaseMs * 0.3) }
        : undefined,
      resequencer: {
        ...options.resequencer,
        store: options.wrapStore?.(store) ?? store,
      },
      tuning: {
        sweepers: {
          gaps: { intervalMs: options.gapSweepIntervalMs ?? false },
          expiry: { intervalMs: false },
        },
        leaseMs: options.leaseMs,
        backpressureDelayMs: options.backpressureDelayMs ?? 50,
      },
    },
    providers: Handler ? [Handler] : [],
    logger: process.env.FAULT_TEST_LOGS ? ['log', 'warn', 'error'] : false,
    // Closed last first: the transport, then the Redis client.
    resources: [() => redis.quit(), () => transport.close()],
  });
  const service = app.get(ResequencerService);
  const gaps: GapEvent[] = [];
  service.onGap((event) => void gaps.push(event));
  return {
    app,
    transport,
    connectionName,
    store,
    handler: Handler ? app.get(Handler) : new RecordingResequencedHandler(),
    service,
    sweeper: app.get(GapSweeper),
    gaps,
    registry: app.get(ModuleMetrics).registry,
    close,
  };
}

/** Publishes one event with the default key and sequence headers, waiting for the confirm. */
export function publishKeyedEvent(
  transport: Transport,
  channel: string,
  event: { key: string; seq: number; body?: Buffer; headers?: HeaderMap },
): Promise<void> {
  return transport.publish(channel, event.body ?? Buffer.from(`${event.key}#${event.seq}`), {
    ...event.headers,
    'x-resequence-key': event.key,
    'x-resequence-seq': event.seq,
  });
}

/**
 * Publishes `events` in their order, `concurrency` at a time (each batch waits for its confirms),
 * as upstream services would.
 */
export async function publishKeyedEvents(
  transport: Transport,
  channel: string,
  events: ReadonlyArray<{ key: string; seq: number }>,
  concurrency = 200,
): Promise<void> {
  for (let i = 0; i < events.length; i += concurrency) {
    await Promise.all(
      events.slice(i, i + concurrency).map((event) => publishKeyedEvent(transport, channel, event)),
    );
  }
}
