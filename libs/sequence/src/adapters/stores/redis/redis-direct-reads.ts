import type { Socket } from 'node:net';
import type { Redis } from 'ioredis';
import { Logger } from '@nestjs/common';
import { withTimeout } from '../../../core/async';
import { errorMessage } from '../../../core/errors/caught';
import { BulkReplyParser, type BulkReply } from './redis-bulk-replies';
import type { Renames } from '../../../core/option-keys';

/** The connection's name in `CLIENT LIST`. */
export const DIRECT_READS_CONNECTION_NAME = 'nest-sequence-reads';

/**
 * Reads of fewer bytes than this go through the client: for them the connection's upkeep (opened
 * again after an idle close) would cost more than the copies it saves.
 */
export const DIRECT_READS_MIN_BYTES = 1024 * 1024;

/**
 * `directReads`, the stores' switch for direct reads until `unsafeSocketTricks` subsumed it: what
 * a store says to options that still pass it.
 */
export const DIRECT_READS_RENAMED: Renames = {
  directReads:
    'unsafeSocketTricks: true (default false), which turns direct reads on with the other ' +
    'socket tricks, to keep reading large values on a connection of their own',
};

/**
 * Error replies that will come back for every read on this connection (its user may not run
 * GETRANGE, it is not authenticated, the command is renamed): they count as its failure.
 */
const LASTING_REFUSAL = /^(NOPERM|NOAUTH|WRONGPASS|ERR unknown command)/;

export interface DirectReadsTiming {
  /** A connection with no read for this long is closed; the next read opens another. */
  readonly idleCloseMs: number;
  /**
   * After a failure, reads go through the shared client for this long, doubled after each
   * failure that follows (up to {@link MAX_RETRY_AFTER_MS}); a read that succeeds resets it.
   */
  readonly retryAfterMs: number;
  /**
   * The longest the connection may stay silent while reads wait on it (or take to open), before
   * it counts as failed. @default the client's `commandTimeout`, else 10 s
   */
  readonly stallMs?: number;
}

const DEFAULT_TIMING: DirectReadsTiming = { idleCloseMs: 10_000, retryAfterMs: 1_000 };
const DEFAULT_STALL_MS = 10_000;
const MAX_RETRY_AFTER_MS = 60_000;

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
 * The connection is a `duplicate()` of the store's client, on the database that client is on, so
 * it is opened, authenticated and routed (TLS, ACL user, Sentinel) as that client is; once it is
 * ready, this class takes its socket's `data` over and writes its commands to the socket itself.
 * Nothing else is ever sent on it, and ioredis neither reconnects it nor retries on it. It opens
 * at the first read and closes after `idleCloseMs` without one; `CLIENT LIST` shows it by its
 * name, {@link DIRECT_READS_CONNECTION_NAME} (after the client's own name, when it has one). It
 * never keeps the process alive while idle.
 *
 * An error reply rejects its read; one that every read would get (NOPERM, NOAUTH, an unknown
 * command) also counts as a failure of the connection. A failure of the connection (it drops
 * while reads wait, stays silent for `stallMs` while they do, cannot be opened within `stallMs`,
 * or sends what is not a reply) rejects every read waiting on it and closes it; after that, reads
 * are refused at once for `retryAfterMs` (doubling while failures repeat). A refused or rejected
 * read is the caller's cue to read through the shared client, whose timeouts, retries and
 * reconnection apply as before ({@link getRangeOrNothing}).
 *
 * Taking a socket over from ioredis relies on its internals (the client's `stream`, `condition`),
 * written for ioredis 5: the stores read this way only with `unsafeSocketTricks`, on ioredis 5.x.
 */
export class RedisDirectReads {
  private readonly logger: Logger;
  private readonly stallMs: number;
  private current?: DirectConnection;
  private opening?: Promise<DirectConnection>;
  /** The duplicate being opened, for `close` to drop. */
  private connecting?: Redis;
  private refusedUntil = 0;
  private failures = 0;
  private closed = false;

  /** @param owner the store that reads, as its warnings name it */
  constructor(
    private readonly client: Redis,
    private readonly timing: DirectReadsTiming = DEFAULT_TIMING,
    owner = 'RedisSequenceStore',
  ) {
    this.logger = new Logger(owner);
    this.stallMs = timing.stallMs ?? client.options.commandTimeout ?? DEFAULT_STALL_MS;
  }

  /**
   * `GETRANGE key start end` (the client's keyPrefix applied). Like GETRANGE, answers no bytes
   * for a missing key: the caller checks the length it expected.
   */
  async getRange(key: string, start: number, end: number): Promise<BulkReply> {
    const connection = await this.connected();
    // Opened before the client selected another database (a read that joined that opening).
    if (connection.database !== this.database) {
      connection.close();
      throw new Error('the client selected another database');
    }
    const reply = await connection.send(
      command(['GETRANGE', `${this.client.options.keyPrefix ?? ''}${key}`, start, end]),
    );
    this.failures = 0;
    return reply;
  }

  /**
   * {@link getRange} for a store that falls back to its client: the parts, or undefined when the
   * direct read was refused or failed (a failure of the connection is logged here) or its reply
   * is not what `whole` takes for the value asked for (given its length in bytes).
   */
  async getRangeOrNothing(
    key: string,
    start: number,
    end: number,
    whole: (bytes: number) => boolean,
  ): Promise<readonly Buffer[] | undefined> {
    try {
      const parts = await this.getRange(key, start, end);
      if (parts === null) return undefined;
      return whole(parts.reduce((sum, part) => sum + part.length, 0)) ? parts : undefined;
    } catch {
      return undefined;
    }
  }

  /** Closes the connection; reads waiting on it are rejected, and later ones refused. */
  close(): Promise<void> {
    this.closed = true;
    this.connecting?.disconnect();
    this.current?.close(new Error('the store was closed'));
    return Promise.resolve();
  }

  /** The database the client is on now: the one it was configured with, or one it selected since. */
  private get database(): number {
    return this.client.condition?.select ?? this.client.options.db ?? 0;
  }

  private connected(): Promise<DirectConnection> {
    if (this.closed) return Promise.reject(new Error('the store was closed'));
    // While the client (re)connects, its database is not known yet (it selects it again when
    // ready): read through it, which waits for that.
    if (this.client.status !== 'ready') {
      return Promise.reject(new Error("the store's client is not ready"));
    }
    // The client selected another database since: this connection reads the wrong one.
    if (this.current !== undefined && this.current.database !== this.database) {
      this.current.close();
    }
    if (this.current !== undefined) return Promise.resolve(this.current);
    if (Date.now() < this.refusedUntil) {
      return Promise.reject(new Error('the connection for direct reads failed recently'));
    }
    this.opening ??= this.open().finally(() => {
      this.opening = undefined;
    });
    return this.opening;
  }

  private async open(): Promise<DirectConnection> {
    const database = this.database;
    const duplicate = this.client.duplicate({
      db: database,
      lazyConnect: true,
      enableOfflineQueue: false,
      retryStrategy: () => null,
      sentinelRetryStrategy: () => null,
      failoverDetector: false,
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
    this.connecting = duplicate;
    const ready = async (): Promise<void> => {
      await duplicate.connect();
      // Every reply to what ioredis sent while connecting (CLIENT SETINFO, SELECT, the ready
      // check) comes before this one's: after it, the socket carries only this class's replies.
      // A refusal (an ACL without PING) is a reply too, and serves as well.
      await duplicate.ping().catch((error: unknown) => {
        if ((error as Error | undefined)?.name !== 'ReplyError') throw error;
      });
    };
    try {
      if (this.closed) throw new Error('the store was closed');
      await withTimeout(ready(), this.stallMs, () => {
        duplicate.disconnect();
        return new Error(`the connection for direct reads did not open within ${this.stallMs} ms`);
      });
      if (this.closed) throw new Error('the store was closed');
    } catch (error) {
      duplicate.disconnect();
      this.failed(error);
      throw error;
    } finally {
      this.connecting = undefined;
    }
    this.current = new DirectConnection(duplicate, database, this.timing.idleCloseMs, this.stallMs);
    this.current.onEnd = (connection, error) => {
      if (this.current === connection) this.current = undefined;
      if (error !== undefined) this.failed(error);
    };
    return this.current;
  }

  private failed(error: unknown): void {
    if (this.closed) return;
    this.failures++;
    const refusedMs = Math.min(
      this.timing.retryAfterMs * 2 ** (this.failures - 1),
      Math.max(MAX_RETRY_AFTER_MS, this.timing.retryAfterMs),
    );
    this.refusedUntil = Date.now() + refusedMs;
    this.logger.warn(
      `reading large values on a connection of their own failed (${errorMessage(error)}): they are ` +
        `read through the store's client for the next ${refusedMs} ms`,
    );
  }
}

/** One taken-over connection: commands written in order, replies matched in order. */
class DirectConnection {
  /** Called once when the connection ends: `error` undefined when it ended with nothing waiting. */
  onEnd?: (connection: DirectConnection, error: unknown) => void;
  private readonly waiting: Waiting[] = [];
  private readonly socket: Socket;
  private readonly parser: BulkReplyParser;
  private idleTimer?: NodeJS.Timeout;
  private stallTimer?: NodeJS.Timeout;
  private ended = false;

  constructor(
    private readonly duplicate: Redis,
    readonly database: number,
    private readonly idleCloseMs: number,
    private readonly stallMs: number,
  ) {
    this.socket = duplicate.stream;
    this.parser = new BulkReplyParser({
      reply: (reply) => this.settle((waiting) => waiting.resolve(reply)),
      error: (message) => {
        this.settle((waiting) => waiting.reject(new Error(message)));
        if (LASTING_REFUSAL.test(message)) this.close(new Error(`Redis refused: ${message}`));
      },
    });
    // ioredis's reply parser stops here: from now on the replies are this class's.
    this.socket.removeAllListeners('data');
    this.socket.on('data', (chunk: Buffer) => {
      this.armStallTimer();
      try {
        this.parser.execute(chunk);
      } catch (error) {
        this.close(error);
      }
    });
    this.socket.once('close', () =>
      // Closed by the server with nothing waiting (its idle `timeout`, a CLIENT KILL): not a
      // failure, the next read opens another.
      this.close(
        this.waiting.length > 0 ? new Error('the connection for direct reads closed') : undefined,
      ),
    );
    this.becameIdle();
  }

  send(bytes: Buffer): Promise<BulkReply> {
    if (this.ended) return Promise.reject(new Error('the connection for direct reads closed'));
    return new Promise<BulkReply>((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      if (this.waiting.length === 1) this.becameBusy();
      this.socket.write(bytes);
    });
  }

  /** Rejects what waits and drops the connection; `error` undefined for a close when idle. */
  close(error?: unknown): void {
    if (this.ended) return;
    this.ended = true;
    clearTimeout(this.idleTimer);
    clearTimeout(this.stallTimer);
    // Late replies (after a stall) are not parsed: they answer reads already rejected.
    this.socket.removeAllListeners('data');
    const reason =
      error instanceof Error ? error : new Error('the connection for direct reads closed');
    for (const waiting of this.waiting.splice(0)) waiting.reject(reason);
    // On a socket the server closed, ioredis has ended the client already; `disconnect` would
    // start a 2 s timer that only the socket's (past) 'close' clears, keeping the process alive.
    if (!this.socket.destroyed) {
      this.duplicate.disconnect();
      this.socket.destroy();
    }
    this.onEnd?.(this, error);
  }

  private settle(outcome: (waiting: Waiting) => void): void {
    const waiting = this.waiting.shift();
    if (waiting === undefined) throw new Error('a reply came for no read');
    outcome(waiting);
    if (this.waiting.length === 0) this.becameIdle();
  }

  private becameBusy(): void {
    clearTimeout(this.idleTimer);
    this.armStallTimer();
    this.socket.ref();
  }

  private becameIdle(): void {
    clearTimeout(this.stallTimer);
    this.socket.unref();
    this.idleTimer = setTimeout(() => this.close(), this.idleCloseMs);
    this.idleTimer.unref();
  }

  /** (Re)starts the wait for the next bytes, while reads wait. */
  private armStallTimer(): void {
    clearTimeout(this.stallTimer);
    this.stallTimer = undefined;
    if (this.waiting.length === 0) return;
    this.stallTimer = setTimeout(
      () => this.close(new Error(`no reply for ${this.stallMs} ms`)),
      this.stallMs,
    );
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
