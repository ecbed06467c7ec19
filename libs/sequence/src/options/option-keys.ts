/**
 * The keys each options object may have, so that a misspelt or renamed option is refused at boot
 * (or at the call) instead of silently keeping its default: TypeScript does not catch an extra
 * key in an object that is not a literal (a `forRootAsync` factory's result, a spread, plain
 * JavaScript). `option-keys.spec.ts` holds these trees equal to the options' types.
 */

import { isPlainObject, unknownKeyProblem, type Renames } from '../core/option-keys';

export type { Renames } from '../core/option-keys';

/** An options object's keys: a nested tree for an object of options, `true` for a value. */
export interface KeyTree {
  readonly [key: string]: KeyTree | true;
}

export const RETRY_POLICY_KEYS = { attempts: true, baseDelayMs: true, maxDelayMs: true } as const;

export const PUBLISH_POLICY_KEYS = {
  confirmTimeoutMs: true,
  retry: RETRY_POLICY_KEYS,
  inFlight: true,
} as const;

const SWEEPER_KEYS = { intervalMs: true, batchSize: true } as const;

const SEQUENCE_LIMIT_KEYS = {
  timeoutMs: true,
  timeoutStrategy: true,
  maxSequenceBytes: true,
  maxFragments: true,
  maxFragmentBytes: true,
  maxHeaderBytes: true,
} as const;

export const SEQUENCE_CONSUMER_KEYS = {
  ...SEQUENCE_LIMIT_KEYS,
  handlerRetry: RETRY_POLICY_KEYS,
  handlerTimeoutMs: true,
  prefetch: true,
  prefetchBytes: true,
  deadLetterChannel: true,
  buffer: true,
  partitions: true,
  window: true,
} as const;

const BOX_KEYS = {
  enabled: true,
  pollIntervalMs: true,
  batchSize: true,
  concurrency: true,
  retry: RETRY_POLICY_KEYS,
  ordered: true,
  retentionMs: true,
  prefetch: true,
} as const;

const BOXES = ['outboxEvents', 'outboxCommands', 'inboxEvents', 'inboxCommands'] as const;

export const MODULE_KEYS: KeyTree = {
  transport: true,
  closeTransport: true,
  stores: true,
  publish: PUBLISH_POLICY_KEYS,
  handlerRetry: RETRY_POLICY_KEYS,
  handlerTimeoutMs: true,
  prefetch: true,
  shutdownTimeoutMs: true,
  metrics: { registry: true, prefix: true },
  tracing: { parent: true, maxLinks: true },
  consumerId: true,
  sequence: {
    ...SEQUENCE_LIMIT_KEYS,
    store: true,
    fragmentBytes: true,
    prefetchBytes: true,
    deadLetterChannel: true,
    maxBufferedBytes: true,
    maxChannelBufferedBytes: true,
    maxOpenSequences: true,
    retentionMs: true,
    onExpired: true,
    encryption: { keys: true },
    buffer: true,
    partitions: true,
    window: true,
    spool: { dir: true, maxBytes: true },
  },
  claimCheck: {
    store: true,
    readStores: true,
    ledger: true,
    signingKeys: true,
    encryption: { keys: true },
    inlineMaxBytes: true,
    sequenceMaxBytes: true,
    ttlMs: true,
    expiredGraceMs: true,
    orphanGraceMs: true,
    deleteAfter: true,
    acceptTicketsWithoutAudience: true,
    readTimeoutMs: true,
    writeTimeoutMs: true,
  },
  resequencer: {
    store: true,
    maxBufferedPerKey: true,
    maxBufferedTotal: true,
    maxBufferedBytesPerKey: true,
    maxBufferedBytesTotal: true,
    maxSeqAhead: true,
    overflow: true,
    onGap: true,
    encryption: { keys: true },
  },
  outbox: {
    store: true,
    migrate: true,
    serviceName: true,
    routes: { event: true, command: true },
    ...Object.fromEntries(BOXES.map((box) => [box, BOX_KEYS])),
  },
  tuning: {
    headerAllowanceBytes: true,
    backpressureDelayMs: true,
    leaseMs: true,
    storeTimeoutMs: true,
    maxStoreRequeues: true,
    drain: { batchSize: true, waitMs: true },
    sweepers: {
      expiry: SWEEPER_KEYS,
      orphans: SWEEPER_KEYS,
      gaps: SWEEPER_KEYS,
      purge: SWEEPER_KEYS,
    },
  },
};

const TIMEOUT_RENAMED = '`timeoutMs` and `timeoutStrategy`';
const PUBLISH_RETRY_RENAMES: Renames = {
  'publish.attempts': '`publish.retry.attempts`',
  'publish.baseDelayMs': '`publish.retry.baseDelayMs`',
  'publish.maxDelayMs': '`publish.retry.maxDelayMs`',
};

export const MODULE_RENAMES: Renames = {
  store: '`sequence.store` (or `stores`, e.g. redis(url) of nest-sequence/redis)',
  ...Object.fromEntries(
    [
      'fragmentBytes',
      'maxSequenceBytes',
      'maxFragments',
      'maxFragmentBytes',
      'prefetchBytes',
      'maxBufferedBytes',
      'maxOpenSequences',
      'retentionMs',
      'onExpired',
      'deadLetterChannel',
    ].map((name) => [name, `\`sequence.${name}\``]),
  ),
  timeout: '`sequence.timeoutMs` and `sequence.timeoutStrategy`',
  sweepIntervalMs: '`tuning.sweepers.expiry.intervalMs`',
  headerAllowanceBytes: '`tuning.headerAllowanceBytes`',
  backpressureDelayMs: '`tuning.backpressureDelayMs`',
  leaseMs: '`tuning.leaseMs`',
  ...PUBLISH_RETRY_RENAMES,
  'claimCheck.threshold': '`claimCheck.inlineMaxBytes`',
  'claimCheck.sweepIntervalMs': '`tuning.sweepers.orphans.intervalMs`',
  'claimCheck.sweepBatch': '`tuning.sweepers.orphans.batchSize`',
  'claimCheck.maxStoreRequeues': '`tuning.maxStoreRequeues`',
  'resequencer.drainBatch': '`tuning.drain.batchSize`',
  'resequencer.drainWaitMs': '`tuning.drain.waitMs`',
  'resequencer.sweepIntervalMs': '`tuning.sweepers.gaps.intervalMs`',
  'resequencer.sweepBatch': '`tuning.sweepers.gaps.batchSize`',
  'outbox.publishTimeoutMs': '`publish.confirmTimeoutMs`',
  'outbox.inboxPrefetch': '`prefetch` of `outbox.inboxEvents` and `outbox.inboxCommands`',
  'outbox.purgeIntervalMs': '`tuning.sweepers.purge.intervalMs`',
  'outbox.purgeBatchSize': '`tuning.sweepers.purge.batchSize`',
  ...Object.fromEntries(
    BOXES.flatMap((box) => [
      [`outbox.${box}.maxAttempts`, `\`outbox.${box}.retry.attempts\``],
      [`outbox.${box}.retryBaseMs`, `\`outbox.${box}.retry.baseDelayMs\``],
      [`outbox.${box}.retryMaxMs`, `\`outbox.${box}.retry.maxDelayMs\``],
    ]),
  ),
};

/** `@SequencedHandler`'s options, and those of `AggregatorService.createConsumer`. */
export const SEQUENCED_HANDLER_KEYS: KeyTree = {
  channel: true,
  mode: true,
  ...SEQUENCE_CONSUMER_KEYS,
};
export const CONSUMER_RENAMES: Renames = { timeout: TIMEOUT_RENAMED };

export const CLAIM_CHECK_HANDLER_KEYS: KeyTree = {
  channel: true,
  deleteAfter: true,
  handlerRetry: RETRY_POLICY_KEYS,
  handlerTimeoutMs: true,
  prefetch: true,
  deadLetterChannel: true,
  sequence: SEQUENCE_LIMIT_KEYS,
};
export const CLAIM_CHECK_HANDLER_RENAMES: Renames = {
  'sequence.timeout': '`sequence.timeoutMs` and `sequence.timeoutStrategy`',
};

export const RESEQUENCER_DEFINITION_KEYS: KeyTree = {
  channel: true,
  name: true,
  key: true,
  seq: true,
  output: true,
  outputInFlight: true,
  callHandler: true,
  start: true,
  gap: { timeoutMs: true, policy: true },
  maxBufferedPerKey: true,
  maxBufferedBytesPerKey: true,
  maxSeqAhead: true,
  overflow: true,
  handlerRetry: RETRY_POLICY_KEYS,
  handlerTimeoutMs: true,
  prefetch: true,
  deadLetterChannel: true,
};

export const INBOX_HANDLER_KEYS: KeyTree = {
  event: true,
  command: true,
  channel: true,
  processInTransaction: true,
  handlerTimeoutMs: true,
};

/** `SplitterService.send`'s options. */
export const SEND_KEYS: KeyTree = {
  sequenceId: true,
  fragmentBytes: true,
  headers: true,
  contentType: true,
  contentEncoding: true,
  publish: PUBLISH_POLICY_KEYS,
  via: true,
  buffer: true,
  partitions: true,
};
export const SEND_RENAMES: Renames = PUBLISH_RETRY_RENAMES;

/** How a payload is parked: the options `checkIn` and `publish` share. */
export const PARK_KEYS: KeyTree = { contentType: true, ttlMs: true, metadata: true };

/** `ClaimCheckService.checkIn`'s options. */
export const CHECK_IN_KEYS: KeyTree = { ...PARK_KEYS, audience: true };

/** `ClaimCheckService.publish`'s options. */
export const CLAIM_PUBLISH_KEYS: KeyTree = {
  ...PARK_KEYS,
  inlineMaxBytes: true,
  mode: true,
  sequenceMaxBytes: true,
  bytes: true,
  headers: true,
};
export const CLAIM_PUBLISH_RENAMES: Renames = { threshold: '`inlineMaxBytes`' };

/** `new SequenceServer(options)` (`nest-sequence/microservices`); `channels` maps channel names. */
export const SEQUENCE_SERVER_KEYS: KeyTree = {
  channels: true,
  channelOf: true,
  streamAboveBytes: true,
  maxJsonBytes: true,
};

/** `SequenceAdminModule.forRoot`'s options (`nest-sequence/admin`). */
export const SEQUENCE_ADMIN_KEYS: KeyTree = {
  path: true,
  guard: true,
  imports: true,
  mutations: true,
  replayRatePerSecond: true,
  maxBatch: true,
  deadLetterChannels: true,
};

/** `SequenceClient`'s options (`nest-sequence/microservices`). */
export const SEQUENCE_CLIENT_KEYS: KeyTree = {
  replyTimeoutMs: true,
  channelOf: true,
  inlineMaxBytes: true,
  sequenceMaxBytes: true,
  maxJsonBytes: true,
  maxReplyBytes: true,
};

function isObject(value: unknown): value is object {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Groups of options that may also be `false` (off), by path. */
const GROUPS_THAT_MAY_BE_FALSE: ReadonlySet<string> = new Set(['metrics', 'tracing']);

/**
 * Adds a problem to `problems` for each key of `value` (and of the option objects within it)
 * that `keys` does not have: what replaced it when it was renamed, else the keys there are; and
 * for a group of options given as anything but an object (`publish: 5000`, a sweeper given as
 * `false`), and for an option given as null (an empty key in a config file), which would
 * otherwise fall back to their defaults without a word. A `value` that is
 * not an object is left to the checks of the caller.
 */
export function checkKeys(
  problems: string[],
  value: unknown,
  keys: KeyTree,
  renames: Renames = {},
  at = '',
): void {
  if (!isPlainObject(value)) return;
  for (const [key, given] of Object.entries(value)) {
    const path = at ? `${at}.${key}` : key;
    const known = keys[key];
    if (known === undefined) {
      problems.push(unknownKeyProblem(path, at, Object.keys(keys), renames));
    } else if (known === true) {
      // An empty key in a config file: no option takes null, and `??` would read it as absent.
      if (given === null) problems.push(nullOptionProblem(path));
    } else if (given !== undefined) {
      if (isObject(given)) checkKeys(problems, given, known, renames, path);
      else if (!(given === false && GROUPS_THAT_MAY_BE_FALSE.has(path))) {
        problems.push(
          `${path} must be an object of options (${Object.keys(known).join(', ')}), got ` +
            describe(given),
        );
      }
    }
  }
}

/** The problem with an option given as null. */
export const nullOptionProblem = (path: string): string =>
  `${path} is null: give a value, or leave the key out for its default`;

/**
 * `value` with its options given as null left out: the keys of `keys`, and of the groups of
 * options within it, whose value is null. For the resolvers, once {@link checkKeys} has reported
 * them, so that each is refused once rather than again by its value's check. Only the groups are
 * copied: an option's value (an adapter, a set of stores, a function) is passed on as it is.
 */
export function withoutNullOptions<T>(value: T, keys: KeyTree): T {
  if (!isPlainObject(value)) return value;
  const kept: Record<string, unknown> = {};
  for (const [key, entry] of Object.entries(value)) {
    if (entry === null) continue;
    const known = keys[key];
    kept[key] = known === undefined || known === true ? entry : withoutNullOptions(entry, known);
  }
  return kept as T;
}

/**
 * What is wrong with the module's options as a whole, if they are not an object: a
 * `forRootAsync` factory that resolves to nothing (a missing `return`), `null`, a string or an
 * array would otherwise boot on the embedded defaults without a word.
 */
export function optionsObjectProblem(value: unknown): string | undefined {
  if (isObject(value)) return undefined;
  return (
    `the options must be an object, got ${describe(value)} (does the forRootAsync factory ` +
    'return them? {} selects the embedded defaults)'
  );
}

function describe(value: unknown): string {
  if (value === undefined) return 'undefined';
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  switch (typeof value) {
    case 'string':
      return JSON.stringify(value);
    case 'number':
    case 'boolean':
    case 'bigint':
      return String(value);
    default:
      return `a ${typeof value}`;
  }
}
