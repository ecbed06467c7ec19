import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import type { Registry } from 'prom-client';
import { MAX_TIMER_MS } from './core/async';
import { SequenceOptionsError } from './core/errors/sequence-options.error';
import { SEQUENCE_ID_PATTERN } from './core/headers';
import { definedOnly } from './core/objects';
import type {
  ExpiryPolicy,
  SequenceLimits,
  SequenceStore,
  ExpiredSequence,
} from './ports/sequence-store.port';
import { MAX_PREFETCH, type Transport } from './ports/transport.port';
import type { ClaimCheckOptions } from './claim-check/claim-check.options';
import type { ResequencerModuleOptions } from './resequencer/resequencer.options';
import type { OutboxModuleOptions } from './outbox/outbox.options';

const KiB = 1024;
const MiB = 1024 * KiB;

export interface PublishRetryOptions {
  /** How long one publish waits for the broker's confirm. @default 10000 */
  confirmTimeoutMs?: number;
  /** Attempts per fragment, the first included. @default 5 */
  attempts?: number;
  /** Delay before the first retry; doubles each time, with jitter. @default 100 */
  baseDelayMs?: number;
  /** Ceiling of the retry delay. @default 5000 */
  maxDelayMs?: number;
  /**
   * Fragments awaiting a confirm at once. Higher hides the broker's round trip; memory held is
   * about `(inFlight + 1) × fragmentBytes`. @default 2
   */
  inFlight?: number;
}

export interface HandlerRetryOptions {
  /** Handler calls per completed sequence, the first included. @default 3 */
  attempts?: number;
  /** Delay before the first retry; doubles each time. @default 200 */
  baseDelayMs?: number;
}

/** Options a `@SequencedHandler` may override for its own channel. */
export interface SequenceConsumerOptions {
  /** Expiry of incomplete sequences. @default { ms: 300000, strategy: 'fixed' } */
  timeout?: Partial<ExpiryPolicy>;
  /** Largest reassembled payload. @default 536870912 (512 MiB) */
  maxSequenceBytes?: number;
  /** Most fragments per sequence. @default 100000 */
  maxFragments?: number;
  /** Largest fragment body accepted; larger ones are dead-lettered. @default transport's maxMessageBytes */
  maxFragmentBytes?: number;
  /** Retries of a failing handler before the sequence is dead-lettered. */
  handlerRetry?: HandlerRetryOptions;
  /**
   * Unsettled messages in a consumer's hands at once. For a sequence consumer, also bounded by
   * `prefetchBytes`. @default 16
   */
  prefetch?: number;
  /**
   * Fragment bytes a sequence consumer (`@SequencedHandler`, stream mode included, or
   * `AggregatorService.createConsumer`) may have in its hands at once: its prefetch is lowered to
   * `floor(prefetchBytes / maxFragmentBytes)`, at least 1, so its accepted deliveries take at most
   * `max(prefetchBytes, maxFragmentBytes)`. With a `maxFragmentBytes` of 16 MiB (the default on
   * the built-in transports), a prefetch of 2; with 2 MiB or less, `prefetch`. The completing
   * fragment stays unsettled while the handler runs, so this also bounds how many handlers run at
   * once: raise it for handlers that are slow and many. Claim Check channels, `@Resequenced` and
   * inbox consumers take `prefetch` as it is.
   * @default 33554432 (32 MiB)
   */
  prefetchBytes?: number;
  /** Where rejected fragments and expiry records go. @default `<channel>.dlq` */
  deadLetterChannel?: string;
}

export interface SequenceModuleOptions extends SequenceConsumerOptions {
  /** The broker. @default a new in-memory transport (one process, no server) */
  transport?: Transport;
  /** Where fragments wait for their sequence. @default a new memory store */
  store?: SequenceStore;
  /**
   * Largest fragment body the splitter sends.
   * @default the transport's `maxMessageBytes` minus `headerAllowanceBytes`
   */
  fragmentBytes?: number;
  /** Room left for headers when deriving `fragmentBytes`. @default 16384 */
  headerAllowanceBytes?: number;
  /** Confirm timeout and retries of each fragment publish. */
  publish?: PublishRetryOptions;
  /** Store-wide ceiling of bytes buffered for open sequences. @default 1073741824 (1 GiB) */
  maxBufferedBytes?: number;
  /** Store-wide ceiling of open sequences. @default 10000 */
  maxOpenSequences?: number;
  /** How long a back-pressured or in-progress fragment waits before redelivery. @default 500 */
  backpressureDelayMs?: number;
  /** How long a completion lease lasts without renewal. @default 30000 */
  leaseMs?: number;
  /** How long finished-sequence markers (and failed sequences' fragments) are kept. @default 3600000 */
  retentionMs?: number;
  /**
   * At shutdown, how long deliveries in progress may take to finish before subscriptions close
   * (their fragments are then redelivered). @default 10000
   */
  shutdownTimeoutMs?: number;
  /** How often the expiry sweeper runs; `false` disables it on this instance. @default 1000 */
  sweepIntervalMs?: number | false;
  /** Called once per expired sequence, by the instance that expired it. */
  onExpired?: (expired: ExpiredSequence) => void | Promise<void>;
  /** prom-client metrics; `false` disables them. @default a new Registry, prefix `nest_sequence_` */
  metrics?: false | { registry?: Registry; prefix?: string };
  /** Identifies this instance in completion leases. @default `<hostname>-<pid>-<random>` */
  consumerId?: string;
  /** Claim Check: payload store, claim ledger, ticket keys, threshold, retention. */
  claimCheck?: ClaimCheckOptions;
  /** Resequencer: the store shared by instances, buffer bounds, gap sweeping. */
  resequencer?: ResequencerModuleOptions;
  /**
   * Transactional Outbox / Inbox: the database (SQLite embedded by default, PostgreSQL for
   * production), relays, inbox processors. Giving it (even `{}`) starts them at bootstrap.
   */
  outbox?: OutboxModuleOptions;
}

/** Consumer options with every default applied. */
export interface ResolvedConsumerOptions {
  readonly timeout: ExpiryPolicy;
  readonly maxSequenceBytes: number;
  readonly maxFragments: number;
  readonly maxFragmentBytes: number;
  readonly handlerRetry: Required<HandlerRetryOptions>;
  readonly prefetch: number;
  readonly prefetchBytes: number;
  readonly deadLetterChannel?: string;
}

/** Module options with every default applied; what the services read. */
export interface ResolvedSequenceOptions extends ResolvedConsumerOptions {
  readonly fragmentBytes: number;
  readonly headerAllowanceBytes: number;
  readonly publish: Required<PublishRetryOptions>;
  readonly maxBufferedBytes: number;
  readonly maxOpenSequences: number;
  readonly backpressureDelayMs: number;
  readonly leaseMs: number;
  readonly retentionMs: number;
  readonly sweepIntervalMs: number | false;
  readonly shutdownTimeoutMs: number;
  readonly onExpired?: (expired: ExpiredSequence) => void | Promise<void>;
  readonly metrics: false | { registry?: Registry; prefix: string };
  readonly consumerId: string;
}

export const SEQUENCE_DEFAULTS = {
  headerAllowanceBytes: 16 * KiB,
  timeout: { ms: 300_000, strategy: 'fixed' } as ExpiryPolicy,
  maxSequenceBytes: 512 * MiB,
  maxFragments: 100_000,
  handlerRetry: { attempts: 3, baseDelayMs: 200 },
  prefetch: 16,
  prefetchBytes: 32 * MiB,
  publish: {
    confirmTimeoutMs: 10_000,
    attempts: 5,
    baseDelayMs: 100,
    maxDelayMs: 5_000,
    inFlight: 2,
  },
  maxBufferedBytes: 1024 * MiB,
  maxOpenSequences: 10_000,
  backpressureDelayMs: 500,
  leaseMs: 30_000,
  retentionMs: 3_600_000,
  sweepIntervalMs: 1_000,
  shutdownTimeoutMs: 10_000,
  metricsPrefix: 'nest_sequence_',
} as const;

/**
 * Applies defaults and validates module options against the transport; throws
 * {@link SequenceOptionsError} listing every problem and how to fix it.
 */
export function resolveSequenceOptions(
  options: SequenceModuleOptions,
  transport: Transport,
): ResolvedSequenceOptions {
  const problems: string[] = [];
  const headerAllowance = options.headerAllowanceBytes ?? SEQUENCE_DEFAULTS.headerAllowanceBytes;
  checkInteger(problems, 'headerAllowanceBytes', headerAllowance, 0);
  const fragmentBytes = options.fragmentBytes ?? transport.maxMessageBytes - headerAllowance;
  if (checkInteger(problems, 'fragmentBytes', fragmentBytes, 1)) {
    if (fragmentBytes + headerAllowance > transport.maxMessageBytes) {
      problems.push(
        `fragmentBytes (${fragmentBytes}) plus headerAllowanceBytes (${headerAllowance}) exceeds ` +
          `the ${transport.name} transport's maxMessageBytes (${transport.maxMessageBytes}); ` +
          `set fragmentBytes to at most ${transport.maxMessageBytes - headerAllowance}`,
      );
    }
  }

  const publish = resolvePublishPolicyInto(problems, SEQUENCE_DEFAULTS.publish, options.publish);

  const consumer = resolveConsumerOptionsInto(problems, options, {
    ...SEQUENCE_DEFAULTS,
    maxFragmentBytes: transport.maxMessageBytes,
  });

  const resolved: ResolvedSequenceOptions = {
    ...consumer,
    fragmentBytes,
    headerAllowanceBytes: headerAllowance,
    publish,
    maxBufferedBytes: options.maxBufferedBytes ?? SEQUENCE_DEFAULTS.maxBufferedBytes,
    maxOpenSequences: options.maxOpenSequences ?? SEQUENCE_DEFAULTS.maxOpenSequences,
    backpressureDelayMs: options.backpressureDelayMs ?? SEQUENCE_DEFAULTS.backpressureDelayMs,
    leaseMs: options.leaseMs ?? SEQUENCE_DEFAULTS.leaseMs,
    retentionMs: options.retentionMs ?? SEQUENCE_DEFAULTS.retentionMs,
    sweepIntervalMs: options.sweepIntervalMs ?? SEQUENCE_DEFAULTS.sweepIntervalMs,
    shutdownTimeoutMs: options.shutdownTimeoutMs ?? SEQUENCE_DEFAULTS.shutdownTimeoutMs,
    onExpired: options.onExpired,
    metrics:
      options.metrics === false
        ? false
        : {
            registry: options.metrics?.registry,
            prefix: options.metrics?.prefix ?? SEQUENCE_DEFAULTS.metricsPrefix,
          },
    consumerId:
      options.consumerId ?? `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`,
  };
  if (
    resolved.metrics !== false &&
    !/^([a-zA-Z_:][a-zA-Z0-9_:]*)?$/.test(resolved.metrics.prefix)
  ) {
    problems.push(
      'metrics.prefix must be empty or a Prometheus metric name (letters, digits, _ and :, not ' +
        `starting with a digit), got ${JSON.stringify(resolved.metrics.prefix)}`,
    );
  }
  checkInteger(problems, 'maxBufferedBytes', resolved.maxBufferedBytes, 1);
  checkInteger(problems, 'maxOpenSequences', resolved.maxOpenSequences, 1);
  checkDelay(problems, 'backpressureDelayMs', resolved.backpressureDelayMs, 0);
  checkDelay(problems, 'leaseMs', resolved.leaseMs, 100);
  checkInteger(problems, 'retentionMs', resolved.retentionMs, 1);
  checkDelay(problems, 'shutdownTimeoutMs', resolved.shutdownTimeoutMs, 0);
  if (resolved.sweepIntervalMs !== false) {
    checkDelay(problems, 'sweepIntervalMs', resolved.sweepIntervalMs, 1);
  }
  if (Number.isSafeInteger(fragmentBytes) && resolved.maxFragmentBytes < fragmentBytes) {
    problems.push(
      `maxFragmentBytes (${resolved.maxFragmentBytes}) is below fragmentBytes (${fragmentBytes}): ` +
        `this module's consumers would dead-letter what its splitter sends; ` +
        `raise maxFragmentBytes or lower fragmentBytes`,
    );
  }
  if (resolved.maxSequenceBytes > resolved.maxBufferedBytes) {
    problems.push(
      `maxSequenceBytes (${resolved.maxSequenceBytes}) exceeds maxBufferedBytes ` +
        `(${resolved.maxBufferedBytes}): such a sequence could never be buffered whole; ` +
        `raise maxBufferedBytes or lower maxSequenceBytes`,
    );
  }
  if (options.onExpired !== undefined && typeof options.onExpired !== 'function') {
    problems.push('onExpired must be a function');
  }
  if (options.consumerId !== undefined && !SEQUENCE_ID_PATTERN.test(options.consumerId)) {
    problems.push('consumerId must be 1-128 characters of [A-Za-z0-9._:-]');
  }
  if (problems.length > 0) throw new SequenceOptionsError('SequenceModule options', problems);
  return resolved;
}

/**
 * Applies a handler's overrides on top of the module's resolved options; throws
 * {@link SequenceOptionsError} naming the handler.
 */
export function resolveConsumerOptions(
  where: string,
  overrides: SequenceConsumerOptions,
  base: ResolvedSequenceOptions,
): ResolvedConsumerOptions {
  const problems: string[] = [];
  const resolved = resolveConsumerOptionsInto(problems, overrides, base);
  if (resolved.maxSequenceBytes > base.maxBufferedBytes) {
    problems.push(
      `maxSequenceBytes (${resolved.maxSequenceBytes}) exceeds the module's maxBufferedBytes ` +
        `(${base.maxBufferedBytes}); raise maxBufferedBytes or lower maxSequenceBytes`,
    );
  }
  if (problems.length > 0) throw new SequenceOptionsError(where, problems);
  return resolved;
}

function resolveConsumerOptionsInto(
  problems: string[],
  options: SequenceConsumerOptions,
  base: {
    timeout: ExpiryPolicy;
    maxSequenceBytes: number;
    maxFragments: number;
    maxFragmentBytes: number;
    handlerRetry: Required<HandlerRetryOptions>;
    prefetch: number;
    prefetchBytes: number;
    deadLetterChannel?: string;
  },
): ResolvedConsumerOptions {
  const timeout: ExpiryPolicy = { ...base.timeout, ...definedOnly(options.timeout ?? {}) };
  checkInteger(problems, 'timeout.ms', timeout.ms, 1);
  if (timeout.strategy !== 'fixed' && timeout.strategy !== 'sliding') {
    problems.push(`timeout.strategy must be 'fixed' or 'sliding', got ${String(timeout.strategy)}`);
  }
  const handlerRetry = { ...base.handlerRetry, ...definedOnly(options.handlerRetry ?? {}) };
  checkInteger(problems, 'handlerRetry.attempts', handlerRetry.attempts, 1);
  checkDelay(problems, 'handlerRetry.baseDelayMs', handlerRetry.baseDelayMs, 0);
  const resolved: ResolvedConsumerOptions = {
    timeout,
    maxSequenceBytes: options.maxSequenceBytes ?? base.maxSequenceBytes,
    maxFragments: options.maxFragments ?? base.maxFragments,
    maxFragmentBytes: options.maxFragmentBytes ?? base.maxFragmentBytes,
    handlerRetry,
    prefetch: options.prefetch ?? base.prefetch,
    prefetchBytes: options.prefetchBytes ?? base.prefetchBytes,
    deadLetterChannel: options.deadLetterChannel ?? base.deadLetterChannel,
  };
  checkInteger(problems, 'maxSequenceBytes', resolved.maxSequenceBytes, 1);
  checkInteger(problems, 'maxFragments', resolved.maxFragments, 1);
  checkInteger(problems, 'maxFragmentBytes', resolved.maxFragmentBytes, 1);
  checkPrefetch(problems, 'prefetch', resolved.prefetch);
  checkInteger(problems, 'prefetchBytes', resolved.prefetchBytes, 1);
  if (resolved.deadLetterChannel !== undefined && resolved.deadLetterChannel.length === 0) {
    problems.push('deadLetterChannel must not be empty');
  }
  return resolved;
}

/** A publish policy: `overrides` on top of `base`, each field validated. */
export function resolvePublishPolicyInto(
  problems: string[],
  base: Required<PublishRetryOptions>,
  overrides: PublishRetryOptions | undefined,
): Required<PublishRetryOptions> {
  const publish = { ...base, ...definedOnly(overrides ?? {}) };
  checkDelay(problems, 'publish.confirmTimeoutMs', publish.confirmTimeoutMs, 1);
  checkInteger(problems, 'publish.attempts', publish.attempts, 1);
  checkDelay(problems, 'publish.baseDelayMs', publish.baseDelayMs, 0);
  checkDelay(problems, 'publish.maxDelayMs', publish.maxDelayMs, 0);
  checkInteger(problems, 'publish.inFlight', publish.inFlight, 1);
  return publish;
}

/** Adds a problem unless `value` is a safe integer >= `min`; says whether it was. */
export function checkInteger(
  problems: string[],
  name: string,
  value: unknown,
  min: number,
): boolean {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min) {
    const got = typeof value === 'string' ? `the string ${JSON.stringify(value)}` : String(value);
    const hint =
      typeof value === 'string' ? ' (convert values read from the environment with Number())' : '';
    problems.push(`${name} must be an integer >= ${min}, got ${got}${hint}`);
    return false;
  }
  return true;
}

/**
 * {@link checkInteger} for a duration a timer waits: also at most {@link MAX_TIMER_MS}, past
 * which Node fires the timer after 1 ms (a sweep or a renewal would spin).
 */
export function checkDelay(problems: string[], name: string, value: unknown, min: number): boolean {
  if (!checkInteger(problems, name, value, min)) return false;
  if ((value as number) > MAX_TIMER_MS) {
    problems.push(
      `${name} must be at most ${MAX_TIMER_MS} ms (the longest a timer waits), got ${String(value)}`,
    );
    return false;
  }
  return true;
}

/**
 * {@link checkInteger} for a subscription's `prefetch`: also at most {@link MAX_PREFETCH}
 * (RabbitMQ's limit, which a subscription on the broker would fail at bootstrap).
 */
export function checkPrefetch(problems: string[], name: string, value: unknown): boolean {
  if (!checkInteger(problems, name, value, 1)) return false;
  if ((value as number) > MAX_PREFETCH) {
    problems.push(`${name} must be at most ${MAX_PREFETCH}, got ${String(value)}`);
    return false;
  }
  return true;
}

/**
 * The prefetch of a sequence consumer: `prefetch`, lowered so that as many fragments of
 * `maxFragmentBytes` fit in `prefetchBytes` (at least 1).
 */
export function fragmentPrefetch(
  options: Pick<ResolvedConsumerOptions, 'prefetch' | 'prefetchBytes' | 'maxFragmentBytes'>,
): number {
  const fitting = Math.floor(options.prefetchBytes / options.maxFragmentBytes);
  return Math.max(1, Math.min(options.prefetch, fitting));
}

/** The store-wide and per-handler limits, as the store port takes them. */
export function sequenceLimits(
  consumer: ResolvedConsumerOptions,
  module: ResolvedSequenceOptions,
): SequenceLimits {
  return {
    maxSequenceBytes: consumer.maxSequenceBytes,
    maxFragments: consumer.maxFragments,
    maxBufferedBytes: module.maxBufferedBytes,
    maxOpenSequences: module.maxOpenSequences,
  };
}
