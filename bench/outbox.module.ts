/**
 * The module's side of the Outbox benchmark: SequenceModule with a PostgresOutboxStore (a table
 * prefix of its own per measurement) and RabbitMqTransport, events recorded with
 * `OutboxService.transaction`, one event per transaction, relayed to one queue.
 */
import type { INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import type * as amqp from 'amqplib';
import { Pool } from 'pg';
import { OutboxService, SequenceModule, type OutboxStore } from 'nest-sequence';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { onCleanup } from './harness/cleanup';
import { nestLogger } from './harness/nest-logger';
import { declareQueue, deleteQueue, messageCount, timeUntilQueued } from './outbox.broker';
import { steadyLatency, type LatencyResult } from './outbox.latency';
import type { Timed } from './outbox.raw';
import {
  AGGREGATE_TYPE,
  BACKLOG_BATCH,
  EVENT_TYPE,
  nextTag,
  queueName,
  RUN_PREFIX,
  runWriters,
  settings,
  sleep,
  type BenchEvent,
} from './outbox.settings';
import { TracedOutboxStore } from './outbox.traced-store';
import { cpuNow, cpuPerThousand } from './outbox.cpu';
import { pgStatsSince, walNow, type PgStatsPerThousand } from './outbox.pg-stats';

/** What `migrate()` creates under a prefix. */
const TABLES = [
  'outbox_events',
  'outbox_commands',
  'inbox_events',
  'inbox_commands',
  'outbox_migrations',
];

export interface ModuleTimed extends Timed {
  /** Seconds the writers took to commit every event while the relay ran (live paths). */
  readonly commitSeconds?: number;
  readonly relay?: ReturnType<TracedOutboxStore['summary']>;
}

/**
 * One measurement's tables and queue, and the apps, stores and transports it opened: closed and
 * dropped when the measurement ends, or by the cleanup if the benchmark stops first.
 */
class Scene {
  readonly tag = nextTag();
  readonly prefix = `${RUN_PREFIX}${this.tag}_`;
  readonly queue = queueName(`mod-${this.tag}`);
  private readonly closers: (() => Promise<void>)[] = [];
  /** Run once everything is closed, before the tables are dropped (their statistics). */
  beforeDrop: (() => Promise<void>) | undefined;
  private readonly cleanup = onCleanup(`close the module's scene ${this.tag}`, () =>
    this.release(),
  );

  constructor(
    readonly connection: amqp.ChannelModel,
    private readonly unsafeSocketTricks: boolean,
  ) {}

  /** A store of this scene's tables, with a pool of its own (traced when asked). */
  store(
    traced: boolean,
  ): OutboxStore &
    Partial<Pick<TracedOutboxStore, 'reset' | 'summary' | 'trackRecords' | 'claimTimesOf'>> {
    const store = PostgresOutboxStore.connect(settings.databaseUrl, {
      tablePrefix: this.prefix,
      pool: { max: settings.poolSize },
    });
    this.closers.push(() => store.close());
    return traced ? new TracedOutboxStore(store) : store;
  }

  /** An app (compiled, not yet initialized) whose relay publishes every event to the queue. */
  async app(store: OutboxStore, relay: boolean, migrate: boolean) {
    const transport = await RabbitMqTransport.connect(settings.amqpUrl, {
      unsafeSocketTricks: this.unsafeSocketTricks,
    });
    this.closers.push(() => transport.close());
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          transport,
          metrics: false,
          outbox: {
            store,
            migrate,
            routes: { event: () => this.queue },
            outboxEvents: {
              enabled: relay,
              batchSize: settings.batchSize,
              concurrency: settings.relayConcurrency,
              retentionMs: settings.retentionMs,
            },
          },
          tuning: { sweepers: { gaps: { intervalMs: false }, expiry: { intervalMs: false } } },
        }),
      ],
    }).compile();
    moduleRef.useLogger(nestLogger('outbox'));
    let app: INestApplicationContext | undefined;
    this.closers.push(async () => {
      await app?.close();
    });
    return {
      init: async () => {
        app = await moduleRef.init();
        return app.get(OutboxService);
      },
    };
  }

  /** Everything the scene opened, closed in reverse order; its tables and queues dropped. */
  close(): Promise<void> {
    return this.cleanup.run();
  }

  private async release(): Promise<void> {
    for (const close of this.closers.reverse()) await close().catch(() => undefined);
    await this.beforeDrop?.().catch(() => undefined);
    await dropPrefixedTables(this.prefix);
    await deleteQueue(this.queue);
  }
}

async function dropPrefixedTables(prefix: string): Promise<void> {
  const pool = new Pool({ connectionString: settings.databaseUrl, max: 1 });
  try {
    await pool.query(`DROP TABLE IF EXISTS ${TABLES.map((table) => prefix + table).join(', ')}`);
  } finally {
    await pool.end();
  }
}

/** Commits `events` in one `OutboxService.transaction`, one `publishEvent` each. */
function commit(outbox: OutboxService, ...events: BenchEvent[]): Promise<void> {
  return outbox.transaction(async (tx) => {
    for (const event of events) {
      tx.publishEvent({
        id: event.id,
        type: EVENT_TYPE,
        aggregateType: AGGREGATE_TYPE,
        aggregateId: event.aggregateId,
        payload: event.payload,
      });
    }
  });
}

/** Waits until the relay has settled every record, and checks that nothing was sent twice. */
async function verify(scene: Scene, store: OutboxStore, count: number): Promise<void> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const stats = await store.stats('outbox_events');
    if (stats.failed > 0) throw new Error(`module: ${stats.failed} records FAILED`);
    if (stats.pending === 0) break;
    if (Date.now() > deadline) throw new Error(`module: ${stats.pending} records still pending`);
    await sleep(20);
  }
  const queued = await messageCount(scene.connection, scene.queue);
  if (queued !== count) throw new Error(`module: queue holds ${queued} of ${count}`);
}

/** Relay running from the start; the writers commit while it relays. */
export async function moduleLive(
  connection: amqp.ChannelModel,
  events: readonly BenchEvent[],
  unsafeSocketTricks: boolean,
): Promise<ModuleTimed> {
  const scene = new Scene(connection, unsafeSocketTricks);
  try {
    await declareQueue(connection, scene.queue);
    const store = scene.store(settings.trace);
    const outbox = await (await scene.app(store, true, true)).init();
    store.reset?.();
    const walBefore = await walNow();
    const timed = await timeUntilQueued(connection, scene.queue, events.length, () =>
      runWriters(events.length, settings.writers, (i) => commit(outbox, events[i])),
    );
    const { seconds, cpu, result: commitSeconds } = timed;
    const relay = store.summary?.();
    await verify(scene, store, events.length);
    let pgStats: PgStatsPerThousand | undefined;
    scene.beforeDrop = async () => {
      pgStats = await pgStatsSince(walBefore, events.length, `${scene.prefix}outbox_events`);
    };
    await scene.close();
    return { messages: events.length, seconds, commitSeconds, cpu, relay, pgStats };
  } finally {
    await scene.close();
  }
}

/**
 * The live path's writers without its relay: the same app and store with the relay off, timed
 * from the first commit to the last (nothing is published). With `rawCommits`, it tells how much
 * of the live path's gap to PostgreSQL's commit rate the writers' side makes.
 */
export async function moduleWritersOnly(
  connection: amqp.ChannelModel,
  events: readonly BenchEvent[],
): Promise<Timed> {
  const scene = new Scene(connection, false);
  try {
    const store = scene.store(false);
    const outbox = await (await scene.app(store, false, true)).init();
    const walBefore = await walNow();
    const cpuBefore = cpuNow();
    const seconds = await runWriters(events.length, settings.writers, (i) =>
      commit(outbox, events[i]),
    );
    const cpu = cpuPerThousand(cpuBefore, cpuNow(), events.length);
    let pgStats: PgStatsPerThousand | undefined;
    scene.beforeDrop = async () => {
      pgStats = await pgStatsSince(walBefore, events.length, `${scene.prefix}outbox_events`);
    };
    await scene.close();
    return { messages: events.length, seconds, cpu, pgStats };
  } finally {
    await scene.close();
  }
}

/**
 * Every event committed with the relay off, then a relay starts and the drain is timed. The
 * backlog (untimed) is committed `BACKLOG_BATCH` events per transaction, to keep the run short:
 * the relay finds the same records, one per event, as after single-event transactions.
 */
export async function moduleRelayOnly(
  connection: amqp.ChannelModel,
  events: readonly BenchEvent[],
  unsafeSocketTricks: boolean,
): Promise<ModuleTimed> {
  const scene = new Scene(connection, unsafeSocketTricks);
  try {
    await declareQueue(connection, scene.queue);
    const writerStore = scene.store(false);
    const writer = await (await scene.app(writerStore, false, true)).init();
    const batches = Math.ceil(events.length / BACKLOG_BATCH);
    await runWriters(batches, settings.writers, (i) =>
      commit(writer, ...events.slice(i * BACKLOG_BATCH, (i + 1) * BACKLOG_BATCH)),
    );
    const store = scene.store(settings.trace);
    const relayApp = await scene.app(store, true, false);
    store.reset?.();
    const { seconds, cpu } = await timeUntilQueued(connection, scene.queue, events.length, () =>
      relayApp.init(),
    );
    const relay = store.summary?.();
    await verify(scene, store, events.length);
    return { messages: events.length, seconds, cpu, relay };
  } finally {
    await scene.close();
  }
}

/**
 * Latency at a steady rate. `notify`: the writers' app has its relay off and the relay runs in
 * another app with its own store and pool, so only PostgreSQL's NOTIFY wakes it (as when the
 * writes happen on other instances). `same-app`: writers and relay in one app, which also wakes
 * its relay in-process after each commit.
 */
export async function moduleLatency(
  connection: amqp.ChannelModel,
  events: readonly BenchEvent[],
  mode: 'notify' | 'same-app',
  unsafeSocketTricks: boolean,
): Promise<LatencyResult & { relay?: ModuleTimed['relay'] }> {
  const scene = new Scene(connection, unsafeSocketTricks);
  try {
    await declareQueue(connection, scene.queue);
    let writer: OutboxService;
    const relayStore = scene.store(settings.trace);
    if (mode === 'same-app') {
      writer = await (await scene.app(relayStore, true, true)).init();
    } else {
      writer = await (await scene.app(scene.store(false), false, true)).init();
      await (await scene.app(relayStore, true, false)).init();
    }
    relayStore.reset?.();
    relayStore.trackRecords?.();
    const latency = await steadyLatency({
      connection,
      queue: scene.queue,
      count: events.length,
      rate: settings.rate,
      commit: (i) => commit(writer, events[i]),
      idOf: (i) => events[i].id,
      messageIdOf: (message) => message.properties.headers?.['x-message-id'] as string | undefined,
      claimTimesOf: (id) => relayStore.claimTimesOf?.(id),
    });
    return { ...latency, relay: relayStore.summary?.() };
  } finally {
    await scene.close();
  }
}
