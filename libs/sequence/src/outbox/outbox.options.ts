import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { definedOnly } from '../core/objects';
import type { BoxName, OutboxStore } from '../ports/outbox-store.port';
import { checkDelay, checkInteger, checkPrefetch } from '../sequence.options';
import { SERVICE_NAME_PATTERN, type OutboxCommand, type OutboxEvent } from './outbox-message';

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
   * Claims this instance runs at once for the box: while one batch is being published, the
   * others are locked or settled (claims never overlap: each takes rows the others do not hold).
   * Each claim holds a pool connection while it runs. @default 3 (outboxes), 1 (inboxes)
   */
  concurrency?: number;
  /** Attempts before a record is `FAILED`, the first included. @default 10 */
  maxAttempts?: number;
  /** Delay before the first retry; doubles each attempt, with jitter. @default 1000 */
  retryBaseMs?: number;
  /** Ceiling of the retry delay. @default 300000 (5 minutes) */
  retryMaxMs?: number;
  /**
   * Outboxes: keep each aggregate's events in commit order: a record is taken only after every
   * earlier one of its aggregate completed (a failing record holds back only its own aggregate);
   * for the commit order to be the append order, appends take a lock per aggregate.
   * Inboxes: handle each aggregate's events in the order this instance received them (its
   * channels are then consumed one message at a time); with several instances competing on a
   * channel, the broker's order is not kept (put a Resequencer in front).
   * @default false
   */
  ordered?: boolean;
  /**
   * How long `COMPLETED` records (an inbox's: the ids that make duplicates recognisable) are kept;
   * `false` keeps them. An inbox's window must exceed the longest time a duplicate can arrive.
   * @default 604800000 (7 days)
   */
  retentionMs?: number | false;
}

/** Module-wide Outbox / Inbox options: `SequenceModule.forRoot({ outbox })`. */
export interface OutboxModuleOptions {
  /**
   * The database of the boxes (and of the business writes made through `OutboxService.transaction`).
   * @default a new in-memory SQLite database (`better-sqlite3`; nothing survives a restart)
   */
  store?: OutboxStore;
  /** Create or upgrade the tables at startup (`store.migrate()`). @default true */
  migrate?: boolean;
  /**
   * This service's name: commands sent to it arrive on `commands.<serviceName>`. Required when an
   * `@InboxHandler({ command })` exists.
   */
  serviceName?: string;
  /** Where relays publish. Defaults: `events.<type>` and `commands.<targetService>`. */
  routes?: {
    /** One channel, or several (each gets a copy: fan-out to several consumers' queues). */
    event?: (event: OutboxEvent) => string | readonly string[];
    command?: (command: OutboxCommand) => string;
  };
  /** How long a relay waits for the broker's confirm of one publish. @default 10000 */
  publishTimeoutMs?: number;
  /** Unsettled inbox messages in this consumer's hands at once, per channel. @default 32 */
  inboxPrefetch?: number;
  /** How often completed records are purged (in small batches). @default 60000 */
  purgeIntervalMs?: number | false;
  /** Records one purge statement deletes. @default 500 */
  purgeBatchSize?: number;
  outboxEvents?: BoxOptions;
  outboxCommands?: BoxOptions;
  inboxEvents?: BoxOptions;
  inboxCommands?: BoxOptions;
}

export interface ResolvedBoxOptions {
  /** `undefined` for an inbox left to decide by its handlers. */
  readonly enabled: boolean | undefined;
  readonly pollIntervalMs: number;
  readonly batchSize: number;
  readonly concurrency: number;
  readonly maxAttempts: number;
  readonly retryBaseMs: number;
  readonly retryMaxMs: number;
  readonly ordered: boolean;
  readonly retentionMs: number | false;
}

export interface ResolvedOutboxOptions {
  /** Whether the app asked for the outbox (an `outbox` option): then it starts at bootstrap. */
  readonly configured: boolean;
  readonly store?: OutboxStore;
  readonly migrate: boolean;
  readonly serviceName?: string;
  readonly routeEvent: (event: OutboxEvent) => readonly string[];
  readonly routeCommand: (command: OutboxCommand) => string;
  readonly publishTimeoutMs: number;
  readonly inboxPrefetch: number;
  readonly purgeIntervalMs: number | false;
  readonly purgeBatchSize: number;
  readonly boxes: Readonly<Record<BoxName, ResolvedBoxOptions>>;
}

const OPTION_NAMES: Record<BoxName, keyof OutboxModuleOptions> = {
  outbox_events: 'outboxEvents',
  outbox_commands: 'outboxCommands',
  inbox_events: 'inboxEvents',
  inbox_commands: 'inboxCommands',
};

export const OUTBOX_DEFAULTS = {
  publishTimeoutMs: 10_000,
  inboxPrefetch: 32,
  purgeIntervalMs: 60_000,
  purgeBatchSize: 500,
  outbox: { pollIntervalMs: 5_000, batchSize: 100, concurrency: 3 },
  inbox: { pollIntervalMs: 2_000, batchSize: 16, concurrency: 1 },
  maxAttempts: 10,
  retryBaseMs: 1_000,
  retryMaxMs: 300_000,
  retentionMs: 7 * 24 * 3_600_000,
} as const;

export const defaultEventChannel = (event: Pick<OutboxEvent, 'type'>): string =>
  `events.${event.type}`;
export const defaultCommandChannel = (command: Pick<OutboxCommand, 'targetService'>): string =>
  `commands.${command.targetService}`;

function resolveBox(
  problems: string[],
  box: BoxName,
  options: BoxOptions = {},
): ResolvedBoxOptions {
  const inbox = box.startsWith('inbox');
  const name = OPTION_NAMES[box];
  const defaults = inbox ? OUTBOX_DEFAULTS.inbox : OUTBOX_DEFAULTS.outbox;
  const resolved: ResolvedBoxOptions = {
    enabled: inbox ? undefined : true,
    pollIntervalMs: defaults.pollIntervalMs,
    batchSize: defaults.batchSize,
    concurrency: defaults.concurrency,
    maxAttempts: OUTBOX_DEFAULTS.maxAttempts,
    retryBaseMs: OUTBOX_DEFAULTS.retryBaseMs,
    retryMaxMs: OUTBOX_DEFAULTS.retryMaxMs,
    ordered: false,
    retentionMs: OUTBOX_DEFAULTS.retentionMs,
    ...definedOnly(options),
  };
  if (resolved.enabled !== undefined && typeof resolved.enabled !== 'boolean') {
    problems.push(`${name}.enabled must be true or false`);
  }
  checkDelay(problems, `${name}.pollIntervalMs`, resolved.pollIntervalMs, 10);
  checkInteger(problems, `${name}.batchSize`, resolved.batchSize, 1);
  checkInteger(problems, `${name}.concurrency`, resolved.concurrency, 1);
  checkInteger(problems, `${name}.maxAttempts`, resolved.maxAttempts, 1);
  checkInteger(problems, `${name}.retryBaseMs`, resolved.retryBaseMs, 0);
  if (checkInteger(problems, `${name}.retryMaxMs`, resolved.retryMaxMs, 0)) {
    if (resolved.retryMaxMs < resolved.retryBaseMs) {
      problems.push(`${name}.retryMaxMs must be >= retryBaseMs`);
    }
  }
  if (typeof resolved.ordered !== 'boolean') problems.push(`${name}.ordered must be true or false`);
  if (resolved.retentionMs !== false) {
    checkInteger(problems, `${name}.retentionMs`, resolved.retentionMs, 1);
  }
  return resolved;
}

/**
 * The Outbox / Inbox options with every default applied; throws a {@link SequenceOptionsError}
 * listing every problem and how to fix it.
 */
export function resolveOutboxOptions(
  options: OutboxModuleOptions | undefined,
): ResolvedOutboxOptions {
  const given = options ?? {};
  const problems: string[] = [];
  const boxes = Object.fromEntries(
    (Object.keys(OPTION_NAMES) as BoxName[]).map((box) => [
      box,
      resolveBox(problems, box, given[OPTION_NAMES[box]] as BoxOptions | undefined),
    ]),
  ) as Record<BoxName, ResolvedBoxOptions>;
  const resolved = {
    publishTimeoutMs: OUTBOX_DEFAULTS.publishTimeoutMs,
    inboxPrefetch: OUTBOX_DEFAULTS.inboxPrefetch,
    purgeIntervalMs: OUTBOX_DEFAULTS.purgeIntervalMs as number | false,
    purgeBatchSize: OUTBOX_DEFAULTS.purgeBatchSize,
    migrate: true,
    ...definedOnly({
      publishTimeoutMs: given.publishTimeoutMs,
      inboxPrefetch: given.inboxPrefetch,
      purgeIntervalMs: given.purgeIntervalMs,
      purgeBatchSize: given.purgeBatchSize,
      migrate: given.migrate,
    }),
  };
  checkDelay(problems, 'outbox.publishTimeoutMs', resolved.publishTimeoutMs, 1);
  checkPrefetch(problems, 'outbox.inboxPrefetch', resolved.inboxPrefetch);
  checkInteger(problems, 'outbox.purgeBatchSize', resolved.purgeBatchSize, 1);
  if (resolved.purgeIntervalMs !== false) {
    checkDelay(problems, 'outbox.purgeIntervalMs', resolved.purgeIntervalMs, 10);
  }
  if (given.serviceName !== undefined && !SERVICE_NAME_PATTERN.test(given.serviceName)) {
    problems.push('outbox.serviceName must be 1-100 letters, digits, _ . - (it names a channel)');
  }
  const store = given.store;
  if (store !== undefined && (typeof store !== 'object' || typeof store.claim !== 'function')) {
    problems.push('outbox.store must be an OutboxStore (PostgresOutboxStore, SqliteOutboxStore)');
  }
  for (const route of ['event', 'command'] as const) {
    const fn = given.routes?.[route];
    if (fn !== undefined && typeof fn !== 'function') {
      problems.push(`outbox.routes.${route} must be a function of the ${route}`);
    }
  }
  if (problems.length > 0)
    throw new SequenceOptionsError('SequenceModule outbox options', problems);
  const routeEvent = given.routes?.event ?? defaultEventChannel;
  return {
    configured: options !== undefined,
    store,
    migrate: resolved.migrate,
    serviceName: given.serviceName,
    routeEvent: (event) => {
      const channels = routeEvent(event);
      return typeof channels === 'string' ? [channels] : channels;
    },
    routeCommand: given.routes?.command ?? defaultCommandChannel,
    publishTimeoutMs: resolved.publishTimeoutMs,
    inboxPrefetch: resolved.inboxPrefetch,
    purgeIntervalMs: resolved.purgeIntervalMs,
    purgeBatchSize: resolved.purgeBatchSize,
    boxes,
  };
}
