import type { Client, ClientConfig, Notification } from 'pg';
import { BOX_NAMES, type BoxName } from '../../../ports/outbox-store.port';
import { endClient, newClient } from './postgres-client';

/** One NOTIFY per box of $2 (text[]) on channel $1. */
export const NOTIFY_BOXES = 'SELECT pg_notify($1, box) FROM unnest($2::text[]) AS box';

export interface OutboxListenerOptions {
  /** Where to connect (the pool's own settings, for a store over a pool). */
  readonly connection: ClientConfig;
  /** The channel appends notify (a PostgreSQL identifier). */
  readonly channel: string;
  /** Called with the box of each notification, and with every box after a reconnect. */
  readonly wake: (box: BoxName) => void;
  /** Delay before the first reconnect attempt; it doubles up to `maxBackoffMs`. */
  readonly initialBackoffMs: number;
  readonly maxBackoffMs: number;
}

/**
 * The store's LISTEN connection: one dedicated client (not a pool's: a pool would hand the
 * connection to someone else, and LISTEN is per session). When the connection drops it
 * reconnects with a growing delay and LISTENs again; notifications sent while it was away are
 * lost, so after a reconnect it wakes every box once and the relays look for themselves.
 */
export class PostgresOutboxListener {
  private client: Client | undefined;
  private reconnectTimer: NodeJS.Timeout | undefined;
  private failedAttempts = 0;
  private stopped = false;
  private announcing = false;

  constructor(private readonly options: OutboxListenerOptions) {}

  /**
   * The `application_name` of the connection, by which an operator (or a test) finds it in
   * `pg_stat_activity`.
   */
  get applicationName(): string {
    return `nest-sequence listen ${this.options.channel}`.slice(0, 63);
  }

  /** Connects and LISTENs; rejects (and stays stopped) when the first attempt fails. */
  async start(): Promise<void> {
    try {
      await this.connect();
    } catch (error) {
      this.stopped = true;
      throw error;
    }
  }

  /**
   * Sends one NOTIFY per box on this connection (a statement of its own, committed at once), when
   * it is up and not already sending one; resolves false otherwise, and the caller takes another
   * connection. It takes none from the application's pool, and the notifications PostgreSQL
   * delivers back to it are its own (the sender's process id is this session's): they wake
   * nothing here, as whoever asked woke this process already.
   */
  async announce(boxes: readonly BoxName[]): Promise<boolean> {
    const client = this.client;
    // One statement at a time on a client; the caller's other connection meanwhile.
    if (!client || this.announcing) return false;
    this.announcing = true;
    try {
      await client.query(NOTIFY_BOXES, [this.options.channel, boxes]);
    } finally {
      this.announcing = false;
    }
    return true;
  }

  /** Ends the connection (see endClient) and any reconnect in progress; idempotent. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.reconnectTimer);
    this.reconnectTimer = undefined;
    const client = this.client;
    this.client = undefined;
    if (client) await endClient(client);
  }

  private async connect(): Promise<void> {
    const client = newClient({
      ...this.options.connection,
      application_name: this.applicationName,
      keepAlive: true,
    });
    // Until it is the current client, errors surface through connect() and query() below.
    client.on('error', () => this.lost(client));
    client.on('end', () => this.lost(client));
    client.on('notification', (message) => this.notified(message));
    try {
      await client.connect();
      // Its announcements need no disk flush (see PostgresOutboxAnnouncer).
      await client.query('SET synchronous_commit TO off');
      await client.query(`LISTEN "${this.options.channel}"`);
    } catch (error) {
      await endClient(client);
      throw error;
    }
    if (this.stopped) {
      // stop() ran while this attempt was connecting.
      await endClient(client);
      return;
    }
    this.client = client;
  }

  private notified(message: Notification): void {
    if (message.channel !== this.options.channel) return;
    // Its own announcement (see announce()).
    if (message.processId === (this.client as { processID?: number } | undefined)?.processID) {
      return;
    }
    const box = message.payload as BoxName;
    if (BOX_NAMES.includes(box)) this.options.wake(box);
  }

  private lost(client: Client): void {
    if (client !== this.client || this.stopped) return;
    this.client = undefined;
    void endClient(client);
    this.scheduleReconnect();
  }

  private scheduleReconnect(): void {
    const { initialBackoffMs, maxBackoffMs } = this.options;
    const ceiling = Math.min(maxBackoffMs, initialBackoffMs * 2 ** this.failedAttempts);
    // Jitter, so that the listeners of many processes do not all come back at the same instant.
    const delay = ceiling / 2 + Math.random() * (ceiling / 2);
    this.reconnectTimer = setTimeout(() => void this.reconnect(), delay);
    // The pool or the application keeps the process alive, not a pending reconnect.
    this.reconnectTimer.unref();
  }

  private async reconnect(): Promise<void> {
    this.reconnectTimer = undefined;
    if (this.stopped) return;
    try {
      await this.connect();
    } catch {
      this.failedAttempts += 1;
      if (!this.stopped) this.scheduleReconnect();
      return;
    }
    this.failedAttempts = 0;
    if (this.stopped) return;
    for (const box of BOX_NAMES) this.options.wake(box);
  }
}
