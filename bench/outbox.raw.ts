/**
 * The Outbox benchmark's baselines, with no outbox at all:
 * - raw publish: amqplib publishing the events on a confirm channel, persistent, to a durable
 *   queue, with at most `batchSize` unconfirmed messages at once (the relay's concurrency);
 * - raw commits: the same number of transactions, each inserting one 1 KB row into a plain table
 *   and committing, on `writers` concurrent writers over a pool of `poolSize` connections (what
 *   PostgreSQL's commit rate allows the outboxes' writers at best);
 * - raw latency: at the latency runs' rate, each such commit followed at once by its publish
 *   (a dual write, which an outbox exists to avoid): the commit-to-arrival latency these cores,
 *   PostgreSQL and RabbitMQ give when nothing stands between the commit and the broker.
 */
import type * as amqp from 'amqplib';
import { Pool } from 'pg';
import { onCleanup } from './harness/cleanup';
import { cpuNow, cpuPerThousand, type CpuPerThousand } from './outbox.cpu';
import { declareQueue, deleteQueue, messageCount } from './outbox.broker';
import { steadyLatency, type LatencyResult } from './outbox.latency';
import { pgStatsSince, walNow, type PgStatsPerThousand } from './outbox.pg-stats';
import {
  nextTag,
  nowMs,
  queueName,
  rawBody,
  rawHeaders,
  RUN_PREFIX,
  runWriters,
  settings,
  type BenchEvent,
} from './outbox.settings';

export interface Timed {
  /** Messages published (or rows committed). */
  readonly messages: number;
  readonly seconds: number;
  readonly cpu: CpuPerThousand;
  /** PostgreSQL's counts (pg and live paths): WAL, and what was done to the outbox table. */
  readonly pgStats?: PgStatsPerThousand;
}

export async function rawPublish(
  connection: amqp.ChannelModel,
  events: readonly BenchEvent[],
): Promise<Timed> {
  const queue = queueName(`raw-${nextTag()}`);
  await declareQueue(connection, queue);
  const bodies = events.map(rawBody);
  const channel = await connection.createConfirmChannel();
  // A channel the broker closes fails the pending confirms; the event itself must be heard.
  channel.on('error', () => undefined);
  try {
    let inFlight = 0;
    let failed: Error | undefined;
    let slotFreed: (() => void) | undefined;
    let allConfirmed: (() => void) | undefined;
    const done = new Promise<void>((resolve) => (allConfirmed = resolve));
    let confirmed = 0;
    const onConfirm = (error: unknown) => {
      if (error) failed ??= error instanceof Error ? error : new Error('negative confirm');
      inFlight -= 1;
      confirmed += 1;
      slotFreed?.();
      if (confirmed === events.length) allConfirmed?.();
    };

    const cpuBefore = cpuNow();
    const started = nowMs();
    for (let i = 0; i < events.length; i++) {
      while (inFlight >= settings.batchSize) {
        await new Promise<void>((resolve) => (slotFreed = resolve));
      }
      inFlight += 1;
      channel.sendToQueue(
        queue,
        bodies[i],
        { persistent: true, headers: rawHeaders(events[i]) },
        onConfirm,
      );
    }
    await done;
    const seconds = (nowMs() - started) / 1000;
    const cpu = cpuPerThousand(cpuBefore, cpuNow(), events.length);
    if (failed) throw failed;
    const count = await messageCount(connection, queue);
    if (count !== events.length) throw new Error(`raw: queue holds ${count} of ${events.length}`);
    return { messages: events.length, seconds, cpu };
  } finally {
    await channel.close().catch(() => undefined);
    await deleteQueue(queue);
  }
}

async function dropTable(table: string): Promise<void> {
  const pool = new Pool({ connectionString: settings.databaseUrl, max: 1 });
  pool.on('error', () => undefined);
  try {
    await pool.query(`DROP TABLE IF EXISTS ${table}`);
  } catch {
    // Swept with the run's tables at the end.
  } finally {
    await pool.end();
  }
}

export async function rawCommits(events: readonly BenchEvent[]): Promise<Timed> {
  const table = `${RUN_PREFIX}pg_${nextTag()}`;
  const pool = new Pool({ connectionString: settings.databaseUrl, max: settings.poolSize });
  pool.on('error', () => undefined);
  // Its table goes with the run's tables if the benchmark stops first (outbox.bench.ts).
  const closePool = onCleanup(`close the pool of ${table}`, () => pool.end());
  try {
    await pool.query(
      `CREATE TABLE ${table} (seq BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE, body TEXT NOT NULL)`,
    );
    const bodies = events.map((event) => rawBody(event).toString());
    const walBefore = await walNow();
    const cpuBefore = cpuNow();
    const seconds = await runWriters(events.length, settings.writers, async (i) => {
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        await client.query(`INSERT INTO ${table} (id, body) VALUES ($1, $2)`, [
          events[i].id,
          bodies[i],
        ]);
        await client.query('COMMIT');
      } finally {
        client.release();
      }
    });
    const cpu = cpuPerThousand(cpuBefore, cpuNow(), events.length);
    await closePool.run();
    return {
      messages: events.length,
      seconds,
      cpu,
      pgStats: await pgStatsSince(walBefore, events.length),
    };
  } finally {
    await closePool.run();
    await dropTable(table);
  }
}

export async function rawLatency(
  connection: amqp.ChannelModel,
  events: readonly BenchEvent[],
): Promise<LatencyResult> {
  const table = `${RUN_PREFIX}pgl_${nextTag()}`;
  const queue = queueName(`raw-latency-${nextTag()}`);
  await declareQueue(connection, queue);
  const pool = new Pool({ connectionString: settings.databaseUrl, max: settings.poolSize });
  pool.on('error', () => undefined);
  const closePool = onCleanup(`close the pool of ${table}`, () => pool.end());
  const channel = await connection.createConfirmChannel();
  channel.on('error', () => undefined);
  try {
    await pool.query(
      `CREATE TABLE ${table} (seq BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE, body TEXT NOT NULL)`,
    );
    const bodies = events.map(rawBody);
    let failed: Error | undefined;
    const result = await steadyLatency({
      connection,
      queue,
      count: events.length,
      rate: settings.rate,
      commit: async (i) => {
        const client = await pool.connect();
        try {
          await client.query('BEGIN');
          await client.query(`INSERT INTO ${table} (id, body) VALUES ($1, $2)`, [
            events[i].id,
            bodies[i].toString(),
          ]);
          await client.query('COMMIT');
        } finally {
          client.release();
        }
        channel.sendToQueue(
          queue,
          bodies[i],
          { persistent: true, headers: rawHeaders(events[i]) },
          (error: unknown) => {
            if (error) failed ??= new Error('negative confirm');
          },
        );
      },
      idOf: (i) => events[i].id,
      messageIdOf: (message) => message.properties.headers?.['x-message-id'] as string | undefined,
    });
    if (failed) throw failed;
    return result;
  } finally {
    await channel.close().catch(() => undefined);
    await closePool.run();
    await dropTable(table);
    await deleteQueue(queue);
  }
}
