/**
 * What a benchmark run leaves on the machine and the servers, and how it goes again: names unique
 * to the run, a temporary directory, RabbitMQ queues, Redis keys under a prefix. Each is handed to
 * the cleanup (cleanup.ts) the moment it exists, and goes at the latest when the benchmark ends.
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import * as amqp from 'amqplib';
import { Redis } from 'ioredis';
import { onCleanup } from './cleanup';
import { progress } from './log';

/**
 * A fresh id for one run, to put in its queue names, key prefixes and table names: 8 hex digits,
 * valid in all of them (a PostgreSQL identifier included).
 */
export function newRunId(): string {
  return randomBytes(4).toString('hex');
}

/** An amqplib connection, closed when the benchmark ends. */
export async function connectAmqp(url: string): Promise<amqp.ChannelModel> {
  const connection = await amqp.connect(url);
  connection.on('error', (error: Error) => progress(`amqplib connection: ${error.message}`));
  onCleanup('close the amqplib connection', async () => {
    await connection.close().catch(() => undefined);
  });
  return connection;
}

/** An ioredis client, closed when the benchmark ends. */
export function connectRedis(url: string): Redis {
  const redis = new Redis(url);
  redis.on('error', (error: Error) => progress(`Redis client: ${error.message}`));
  onCleanup('close the Redis client', async () => {
    await redis.quit().catch(() => redis.disconnect());
  });
  return redis;
}

/** A new directory `<parent>/<prefix>XXXXXX`, removed with everything in it when the run ends. */
export function temporaryDirectory(prefix: string, parent = tmpdir()): string {
  const dir = mkdtempSync(join(resolve(parent), prefix));
  onCleanup(`remove ${dir}`, () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * The queues a run uses: each is tracked before it is declared (by the benchmark or by a
 * transport), deleted when the run is done with it, and whatever is still tracked is deleted when
 * the benchmark ends. Tracking a queue after that has happened fails, so that a run being stopped
 * does not declare new ones. Deletions go through a connection of the janitor's own, so that they
 * do not depend on the state of the benchmark's connections (one that a stopped run's last
 * operation broke, say).
 */
export class QueueJanitor {
  private readonly queues = new Set<string>();
  private readonly exchanges = new Set<string>();
  private connection?: Promise<amqp.ChannelModel>;
  private swept = false;

  /** Registers the final sweep. */
  constructor(
    private readonly url: string,
    private readonly label: string,
  ) {
    onCleanup(`delete the queues ${label}`, () => this.sweep());
  }

  /** Tracks `queues` for deletion; returns the first. */
  track(...queues: string[]): string {
    if (this.swept) throw new Error(`the run is over: not declaring ${queues.join(', ')}`);
    for (const queue of queues) this.queues.add(queue);
    return queues[0];
  }

  /** Tracks `exchanges` for deletion. */
  trackExchanges(...exchanges: string[]): void {
    for (const exchange of exchanges) this.exchanges.add(exchange);
  }

  /** Deletes `queues` now (missing ones are fine). */
  async delete(...queues: string[]): Promise<void> {
    const channel = await (await this.connect()).createChannel();
    // A refused operation closes the channel; heard here, it rejects the call instead.
    channel.on('error', () => undefined);
    try {
      for (const queue of queues) {
        await channel.deleteQueue(queue);
        this.queues.delete(queue);
      }
      for (const exchange of [...this.exchanges]) {
        await channel.deleteExchange(exchange);
        this.exchanges.delete(exchange);
      }
    } finally {
      await channel.close().catch(() => undefined);
    }
  }

  private connect(): Promise<amqp.ChannelModel> {
    this.connection ??= amqp.connect(this.url).then((connection) => {
      const forget = () => (this.connection = undefined);
      connection.on('error', forget);
      connection.on('close', forget);
      return connection;
    });
    return this.connection;
  }

  private async sweep(): Promise<void> {
    this.swept = true;
    const count = this.queues.size;
    try {
      if (count === 0) return;
      // Once more on a fresh connection if the first attempt fails midway.
      await this.delete(...this.queues).catch(() => this.delete(...this.queues));
      progress(`deleted ${count} queue(s) ${this.label}`);
    } finally {
      const connection = await this.connection?.catch(() => undefined);
      await connection?.close().catch(() => undefined);
    }
  }
}

/** Deletes every key matching `pattern` (SCAN, then UNLINK); resolves how many. */
export async function deleteKeys(redis: Redis, pattern: string): Promise<number> {
  let cursor = '0';
  let deleted = 0;
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) deleted += await redis.unlink(...keys);
  } while (cursor !== '0');
  return deleted;
}

/**
 * Deletes the keys under `prefix` (`<prefix>:*`) when the benchmark ends, through a client of its
 * own. Call it before connecting the clients that write those keys: the steps run last first, so
 * the deletion then comes after they are closed, and no late write of a stopped run survives it.
 */
export function deleteKeysWhenDone(url: string, prefix: string): void {
  onCleanup(`delete Redis keys ${prefix}:*`, async () => {
    const redis = new Redis(url);
    try {
      const deleted = await deleteKeys(redis, `${prefix}:*`);
      progress(`deleted ${deleted} Redis key(s) under ${prefix}:`);
    } finally {
      await redis.quit().catch(() => redis.disconnect());
    }
  });
}
