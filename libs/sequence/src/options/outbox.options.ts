import type { OutboxCommand, OutboxEvent } from '../core/outbox-message';
import type { OutboxStore } from '../ports/outbox-store.port';
import type { RetryPolicy } from './module-options';

/** One box's relay (outbox) or processor (inbox). */
export interface BoxOptions {
  /**
   * Run this box's relay or processor on this instance.
   * @default true for the outboxes; for an inbox, true when an `@InboxHandler` of its kind exists
   */
  enabled?: boolean;
  /**
   * How often the relay or processor looks for due records even without a wake-up (a commit in
   * this process, or a PostgreSQL NOTIFY): the safety net for lost wake-ups and for retries.
   * @default 5000 (outboxes), 2000 (inboxes)
   */
  pollIntervalMs?: number;
  /** Most records one claim takes. @default 100 (outboxes), 16 (inboxes) */
  batchSize?: number;
  /**
   * Most claims this instance runs at once for the box (they never overlap: each takes rows the
   * others do not hold); each holds a pool connection while it runs. A relay runs more than one
   * only while its claims come back full (a backlog): commits during a claim go out in the next
   * one (a claim held up by a slow broker holds them back until it ends). An inbox processor
   * also starts one for a commit while others run.
   * @default 3 (outboxes), 1 (inboxes)
   */
  concurrency?: number;
  /**
   * Retries of a record whose publish (outbox) or handler (inbox) failed; after the last attempt
   * it is kept `FAILED`. @default { attempts: 10, baseDelayMs: 1000, maxDelayMs: 300000 }
   */
  retry?: RetryPolicy;
  /**
   * Outboxes: keep each aggregate's events in commit order: a record is taken only after every
   * earlier one of its aggregate completed; appends take a lock per aggregate. Inboxes: handle
   * each aggregate's events in the order this instance received them (its channels are then
   * consumed one message at a time), one call at a time: a call past `handlerTimeoutMs` holds
   * back its aggregate here until it returns. @default false
   */
  ordered?: boolean;
  /**
   * How long `COMPLETED` records (an inbox's: the ids that make duplicates recognisable) are
   * kept; `false` keeps them. An inbox's window must exceed the longest time a duplicate can
   * arrive. Outboxes also take `0`: the relay deletes each record in the transaction that settles
   * its publish instead of marking it `COMPLETED` (less work for the database per message; the
   * box then forgets an id once it is published, so recording the same id again publishes it
   * again). @default 604800000 (7 days)
   */
  retentionMs?: number | false;
  /** Inboxes: unsettled messages this consumer holds at once, per channel. @default 32 */
  prefetch?: number;
}

/** Transactional Outbox / Inbox options: `SequenceModule.forRoot({ outbox })`. */
export interface OutboxOptions {
  /**
   * The database of the boxes (and of the business writes made through `OutboxService.transaction`).
   * @default the `stores` preset's, else an in-memory SQLite database (better-sqlite3; nothing survives a restart)
   */
  store?: OutboxStore;
  /** Create or upgrade the tables at startup (`store.migrate()`). @default true */
  migrate?: boolean;
  /**
   * This service's name: commands sent to it arrive on `commands.<serviceName>`. Required when an
   * `@InboxHandler({ command })` exists.
   */
  serviceName?: string;
  /** Where relays publish. @default `events.<type>` and `commands.<targetService>` */
  routes?: {
    /** One channel, or several (each gets a copy: fan-out to several consumers' queues). */
    event?: (event: OutboxEvent) => string | readonly string[];
    command?: (command: OutboxCommand) => string;
  };
  outboxEvents?: BoxOptions;
  outboxCommands?: BoxOptions;
  inboxEvents?: BoxOptions;
  inboxCommands?: BoxOptions;
}
