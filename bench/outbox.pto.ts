/**
 * pg-transactional-outbox's side of the Outbox benchmark, in its polling mode, set up as its
 * README and its generated `.env` template describe: `DatabaseSetup` creates the outbox table,
 * the `next_outbox_messages` polling function and the polling indexes (in a schema of its own per
 * measurement, dropped after); `initializeMessageStorage` stores each message inside the writer's
 * transaction; `initializePollingMessageListener` relays them with a GeneralMessageHandler that
 * publishes on an amqplib confirm channel (persistent, to the same kind of queue as the others)
 * and resolves on the broker's confirm. Settings: the documented defaults (batch size 5, polling
 * interval 500 ms, lock 5000 ms, the outbox's max-attempts and poisonous-message protection off),
 * one database role (the README allows it for polling), its logger disabled.
 *
 * Messages are `concurrency: 'parallel'`: the module's relay, unordered by default, publishes a
 * batch concurrently, and 'sequential' (the library's default) would publish one message per
 * poll across the whole table (all have the same, empty, segment).
 */
import type * as amqp from 'amqplib';
import { Pool } from 'pg';
import {
  DatabaseSetup,
  getDisabledLogger,
  initializeMessageStorage,
  initializePollingMessageListener,
  type GeneralMessageHandler,
  type PollingListenerConfig,
  type TransactionalMessage,
} from 'pg-transactional-outbox';
import { onCleanup } from './harness/cleanup';
import { declareQueue, deleteQueue, messageCount, timeUntilQueued } from './outbox.broker';
import { steadyLatency, type LatencyResult } from './outbox.latency';
import type { ModuleTimed } from './outbox.module';
import {
  AGGREGATE_TYPE,
  BACKLOG_BATCH,
  EVENT_TYPE,
  nextTag,
  PTO_SCHEMA_PREFIX,
  queueName,
  runWriters,
  settings,
  sleep,
  type BenchEvent,
} from './outbox.settings';

const TABLE = 'outbox';
const FUNCTION = 'next_outbox_messages';

class PtoScene {
  readonly tag = nextTag();
  readonly schema = `${PTO_SCHEMA_PREFIX}${this.tag}`;
  readonly queue = queueName(`pto-${this.tag}`);
  /** The writers' pool (the same size as the module store's). */
  readonly pool = new Pool({ connectionString: settings.databaseUrl, max: settings.poolSize });
  private readonly logger = getDisabledLogger();
  private readonly store = initializeMessageStorage(this.config(), this.logger);
  private shutdown: (() => Promise<void>) | undefined;
  private channel: amqp.ConfirmChannel | undefined;
  private readonly cleanup = onCleanup(`close the pto scene ${this.tag}`, () => this.release());

  constructor(readonly connection: amqp.ChannelModel) {
    this.pool.on('error', () => undefined);
  }

  config(): PollingListenerConfig {
    return {
      outboxOrInbox: 'outbox',
      dbListenerConfig: { connectionString: settings.databaseUrl },
      settings: {
        dbSchema: this.schema,
        dbTable: TABLE,
        enableMaxAttemptsProtection: false,
        enablePoisonousMessageProtection: false,
        nextMessagesFunctionName: FUNCTION,
        nextMessagesFunctionSchema: this.schema,
        nextMessagesBatchSize: settings.ptoBatchSize,
        nextMessagesPollingIntervalInMs: settings.ptoPollMs,
      },
    };
  }

  /** The table, polling function and indexes, as DatabaseSetup writes them, and the queue. */
  async setUp(): Promise<void> {
    const setup = {
      outboxOrInbox: 'outbox' as const,
      database: new URL(settings.databaseUrl).pathname.slice(1),
      schema: this.schema,
      table: TABLE,
      listenerRole: 'postgres',
      nextMessagesSchema: this.schema,
      nextMessagesName: FUNCTION,
    };
    const client = await this.pool.connect();
    try {
      await client.query('BEGIN');
      await client.query(`CREATE SCHEMA ${this.schema}`);
      // setupPollingIndexes drops its indexes by unqualified name: keep that inside our schema.
      await client.query(`SET LOCAL search_path TO ${this.schema}`);
      await client.query(DatabaseSetup.dropAndCreateTable(setup));
      await client.query(DatabaseSetup.createPollingFunction(setup));
      await client.query(DatabaseSetup.setupPollingIndexes(setup));
      await client.query('COMMIT');
    } catch (error) {
      await client.query('ROLLBACK').catch(() => undefined);
      throw error;
    } finally {
      client.release();
    }
    await declareQueue(this.connection, this.queue);
  }

  /** One transaction storing a message per event, as the README's producer does. */
  async commit(...events: BenchEvent[]): Promise<void> {
    const client = await this.pool.connect();
    try {
      await client.query('BEGIN');
      for (const event of events) {
        const message: TransactionalMessage = {
          id: event.id,
          aggregateType: AGGREGATE_TYPE,
          aggregateId: event.aggregateId,
          messageType: EVENT_TYPE,
          payload: event.payload,
          concurrency: 'parallel',
        };
        await this.store(message, client);
      }
      await client.query('COMMIT');
      client.release();
    } catch (error) {
      await client.query('ROLLBACK').catch(() => undefined);
      client.release(true);
      throw error;
    }
  }

  /** Starts the polling listener, publishing each message with a confirm. */
  async startListener(): Promise<void> {
    const channel = await this.connection.createConfirmChannel();
    // A channel the broker closes fails the pending publishes (pto retries them); heard here.
    channel.on('error', () => undefined);
    this.channel = channel;
    const publisher: GeneralMessageHandler = {
      handle: (message) =>
        new Promise<void>((resolve, reject) => {
          channel.sendToQueue(
            this.queue,
            Buffer.from(JSON.stringify(message)),
            { persistent: true, messageId: message.id, contentType: 'application/json' },
            (error) =>
              error ? reject(error instanceof Error ? error : new Error(String(error))) : resolve(),
          );
        }),
    };
    [this.shutdown] = initializePollingMessageListener(this.config(), publisher, this.logger);
  }

  /** Waits until every message is processed, and checks that nothing was sent twice. */
  async verify(count: number): Promise<void> {
    const deadline = Date.now() + 30_000;
    for (;;) {
      const { rows } = await this.pool.query<{ done: string }>(
        `SELECT count(*) AS done FROM ${this.schema}.${TABLE} WHERE processed_at IS NOT NULL`,
      );
      if (Number(rows[0].done) >= count) break;
      if (Date.now() > deadline) throw new Error(`pto: ${rows[0].done} of ${count} processed`);
      await sleep(20);
    }
    const queued = await messageCount(this.connection, this.queue);
    if (queued !== count) throw new Error(`pto: queue holds ${queued} of ${count}`);
  }

  /** The listener, channel and pool closed; the schema dropped and the queue deleted. */
  close(): Promise<void> {
    return this.cleanup.run();
  }

  private async release(): Promise<void> {
    await this.shutdown?.().catch(() => undefined);
    await this.channel?.close().catch(() => undefined);
    await this.pool.query(`DROP SCHEMA IF EXISTS ${this.schema} CASCADE`).catch(() => undefined);
    await this.pool.end();
    await deleteQueue(this.queue);
  }
}

/** Listener running from the start; the writers commit while it relays. */
export async function ptoLive(
  connection: amqp.ChannelModel,
  events: readonly BenchEvent[],
): Promise<ModuleTimed> {
  const scene = new PtoScene(connection);
  try {
    await scene.setUp();
    await scene.startListener();
    const timed = await timeUntilQueued(connection, scene.queue, events.length, () =>
      runWriters(events.length, settings.writers, (i) => scene.commit(events[i])),
    );
    const { seconds, cpu, result: commitSeconds } = timed;
    await scene.verify(events.length);
    return { messages: events.length, seconds, commitSeconds, cpu };
  } finally {
    await scene.close();
  }
}

/**
 * Every message committed with no listener (`BACKLOG_BATCH` per transaction, untimed, as for the
 * module); then the listener starts and the drain is timed.
 */
export async function ptoRelayOnly(
  connection: amqp.ChannelModel,
  events: readonly BenchEvent[],
): Promise<ModuleTimed> {
  const scene = new PtoScene(connection);
  try {
    await scene.setUp();
    const batches = Math.ceil(events.length / BACKLOG_BATCH);
    await runWriters(batches, settings.writers, (i) =>
      scene.commit(...events.slice(i * BACKLOG_BATCH, (i + 1) * BACKLOG_BATCH)),
    );
    const { seconds, cpu } = await timeUntilQueued(connection, scene.queue, events.length, () =>
      scene.startListener(),
    );
    await scene.verify(events.length);
    return { messages: events.length, seconds, cpu };
  } finally {
    await scene.close();
  }
}

export async function ptoLatency(
  connection: amqp.ChannelModel,
  events: readonly BenchEvent[],
  rate: number,
): Promise<LatencyResult> {
  const scene = new PtoScene(connection);
  try {
    await scene.setUp();
    await scene.startListener();
    return await steadyLatency({
      connection,
      queue: scene.queue,
      count: events.length,
      rate,
      commit: (i) => scene.commit(events[i]),
      idOf: (i) => events[i].id,
      messageIdOf: (message) => message.properties.messageId as string | undefined,
    });
  } finally {
    await scene.close();
  }
}
