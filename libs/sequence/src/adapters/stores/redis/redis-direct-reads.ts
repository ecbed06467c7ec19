import type { Socket } from 'node:net';
import type { Redis } from 'ioredis';
import { Logger } from '@nestjs/common';
import { errorMessage } from '../../../core/errors/caught';
import { BulkReplyParser, type BulkReply } from './redis-bulk-replies';

/** The connection's name in `CLIENT LIST`. */
export const DIRECT_READS_CONNECTION_NAME = 'nest-sequence-reads';
/** A connection that failed is not tried again for this long: reads use the shared client. */
const RETRY_AFTER_MS = 1_000;
/** A connection with no read for this long is closed; the next read opens another. */
const IDLE_CLOSE_MS = 10_000;

interface Waiting {
  resolve(reply: BulkReply): void;
  reject(error: Error): void;
}

/**
 * `GETRANGE` on a connection of its own, whose replies are parsed without copying
 * ({@link BulkReplyParser}): a large body read back costs one allocation per byte (the socket's
 * chunk) instead of two, and no copy. It exists for memory: at hundreds of MiB per second, the
 * copies ioredis's parser makes are most of the garbage a consumer process holds at its peak.
 *
 * The connection is a `duplicate()` of the store's client, so it is opened, authenticated and
 * routed (TLS, ACL user, database, Sentinel) exactly as that client is; once it is ready, this
 * class takes its socket's `data` over and writes its commands to the socket itself. Nothing else
 * is ever sent on it. It opens at the first read, closes after {@link IDLE_CLOSE_MS} without one,
 * and never keeps the process alive while idle; `CLIENT LIST` shows it by its name,
 * {@link DIRECT_READS_CONNECTION_NAME} (after the client's own name, when it has one). An error
 * reply rejects its read. A failure of the connection (it drops, a reply is malformed) rejects
 * every read waiting on it and closes it, and for the next {@link RETRY_AFTER_MS} reads are refused
 * at once; the caller then reads through the shared client, whose retries and reconnection apply
 * as before.
 */
export class RedisDirectReads {
  private readonly logger = new Logger('RedisSequenceStore');
  private current?: DirectConnection;
  private opening?: Promise<DirectConnection>;
  private failedAt = -Infinity;
  private closed = false;

  constructor(
    private readonly client: Redis,
    private readonly timing: { idleCloseMs: number; retryAfterMs: number } = {
      idleCloseMs: IDLE_CLOSE_MS,
      retryAfterMs: RETRY_AFTER_MS,
    },
  ) {}

  /**
   * `GETRANGE key start end` (the client's keyPrefix applied). Like GETRANGE, answers no bytes
   * for a missing key: the caller checks the length it expected.
   */
  async getRange(key: string, start: number, end: number): Promise<BulkReply> {
    const connection = await this.connected();
    return connection.send(
      command(['GETRANGE', `${this.client.options.keyPrefix ?? ''}${key}`, start, end]),
    );
  }

  /** Closes the connection; reads waiting on it are rejected, and later ones refused. */
  async close(): Promise<void> {
    this.closed = true;
    const opening = this.opening;
    this.current?.close(new Error('the store was closed'));
    // One being opened closes itself when it sees `closed`.
    await opening?.catch(() => undefined);
  }

  private connected(): Promise<DirectConnection> {
    if (this.closed) return Promise.reject(new Error('the store was closed'));
    if (this.current !== undefined) return Promise.resolve(this.current);
    if (Date.now() - this.failedAt < this.timing.retryAfterMs) {
      return Promise.reject(new Error('the connection for direct reads failed recently'));
    }
    this.opening ??= this.open().finally(() => {
      this.opening = undefined;
    });
    return this.opening;
  }

  private async open(): Promise<DirectConnection> {
    const duplicate = this.client.duplicate({
      lazyConnect: true,
      enableOfflineQueue: false,
      retryStrategy: () => null,
      reconnectOnError: null,
      maxRetriesPerRequest: 0,
      enableAutoPipelining: false,
      autoResubscribe: false,
      readOnly: false,
      monitor: false,
      connectionName: [this.client.options.connectionName, DIRECT_READS_CONNECTION_NAME]
        .filter(Boolean)
        .join('-'),
    });
    // Failures reach the reads as rejections; without a listener ioredis would print them.
    duplicate.on('error', () => undefined);
    try {
      await duplicate.connect();
      // Every reply to what ioredis sent while connecting (CLIENT SETINFO, SELECT, the ready
      // check) comes before this one's: after it, the socket carries only this class's replies.
      await duplicate.ping();
      if (this.closed) throw new Error('the store was closed');
    } catch (error) {
      duplicate.disconnect();
      this.ended(undefined, error);
      throw error;
    }
    this.current = new DirectConnection(duplicate, this.timing.idleCloseMs, (connection, error) =>
      this.ended(connection, error),
    );
    return this.current;
  }

  /** Called once per connection that ends (`error` undefined: closed when idle), and when one cannot be opened. */
  private ended(connection: DirectConnection | undefined, error: unknown): void {
    if (connection !== undefined && this.current === connection) this.current = undefined;
    if (error === undefined || this.closed) return;
    this.failedAt = Date.now();
    this.logger.warn(
      `reading bodies on a connection of their own failed (${errorMessage(error)}): they are ` +
        `read through the store's client for the next ${this.timing.retryAfterMs} ms`,
    );
  }
}

/** One taken-over connection: commands written in order, replies matched in order. */
class DirectConnection {
  private readonly waiting: Waiting[] = [];
  private readonly socket: Socket;
  private readonly parser: BulkReplyParser;
  private idleTimer?: NodeJS.Timeout;
  private ended = false;

  constructor(
    private readonly duplicate: Redis,
    private readonly idleCloseMs: number,
    private readonly onEnd: (connection: DirectConnection, error: unknown) => void,
  ) {
    this.socket = duplicate.stream;
    this.parser = new BulkReplyParser({
      reply: (reply) => this.settle((waiting) => waiting.resolve(reply)),
      error: (message) => this.settle((waiting) => waiting.reject(new Error(message))),
    });
    // ioredis's reply parser stops here: from now on the replies are this class's.
    this.socket.removeAllListeners('data');
    this.socket.on('data', (chunk: Buffer) => {
      try {
        this.parser.execute(chunk);
      } catch (error) {
        this.close(error);
      }
    });
    this.socket.once('close', () =>
      this.close(new Error('the connection for direct reads closed')),
    );
    this.becameIdle();
  }

  send(bytes: Buffer): Promise<BulkReply> {
    if (this.ended) return Promise.reject(new Error('the connection for direct reads closed'));
    return new Promise<BulkReply>((resolve, reject) => {
      if (this.waiting.length === 0) this.becameBusy();
      this.waiting.push({ resolve, reject });
      this.socket.write(bytes);
    });
  }

  /** Rejects what waits and drops the connection; `error` undefined for an idle close. */
  close(error?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    clearTimeout(this.idleTimer);
    const reason =
      error instanceof Error ? error : new Error('the connection for direct reads closed');
    for (const waiting of this.waiting.splice(0)) waiting.reject(reason);
    this.duplicate.disconnect();
    this.onEnd(this, error);
  }

  private settle(outcome: (waiting: Waiting) => void): void {
    const waiting = this.waiting.shift();
    if (waiting === undefined) throw new Error('a reply came for no read');
    outcome(waiting);
    if (this.waiting.length === 0) this.becameIdle();
  }

  private becameBusy(): void {
    clearTimeout(this.idleTimer);
    this.socket.ref();
  }

  private becameIdle(): void {
    this.socket.unref();
    this.idleTimer = setTimeout(() => this.close(), this.idleCloseMs);
    this.idleTimer.unref();
  }
}

/** A command in RESP: an array of bulk strings. */
function command(parts: ReadonlyArray<string | number>): Buffer {
  const encoded = parts.map((part) => Buffer.from(String(part)));
  return Buffer.concat([
    Buffer.from(`*${encoded.length}\r\n`),
    ...encoded.flatMap((part) => [Buffer.from(`$${part.length}\r\n`), part, Buffer.from('\r\n')]),
  ]);
}
