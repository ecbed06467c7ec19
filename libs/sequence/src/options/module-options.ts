import type { Registry } from 'prom-client';
import type { StoreSet } from '../ports/store-set.port';
import type { Transport } from '../ports/transport.port';
import type { ClaimCheckOptions } from './claim-check.options';
import type { OutboxOptions } from './outbox.options';
import type { ResequencerOptions } from './resequencer.options';
import type { MessageSequenceOptions } from './sequence.options';

/**
 * How a failing call is tried again: publishing a message, calling a handler, relaying or
 * handling an outbox or inbox record. Every retry in the module takes this one shape.
 */
export interface RetryPolicy {
  /** Calls in all, the first included. */
  attempts?: number;
  /** Wait before the first retry; it doubles at each one, with jitter. */
  baseDelayMs?: number;
  /** Ceiling of the wait. */
  maxDelayMs?: number;
}

/**
 * How the module publishes: every fragment, ticket and resequenced output. The outbox relay uses
 * `confirmTimeoutMs` only: a record that fails is retried on its box's `retry` schedule.
 */
export interface PublishPolicy {
  /** How long one publish waits for the broker's confirm (the outbox relay's too). @default 10000 */
  confirmTimeoutMs?: number;
  /** Retries of a publish that failed or timed out. @default { attempts: 5, baseDelayMs: 100, maxDelayMs: 5000 } */
  retry?: RetryPolicy;
  /**
   * Fragments of one sequence awaiting their confirm at once. Higher hides the broker's round
   * trip; memory held is about `(inFlight + 1) × fragmentBytes`. @default 2
   */
  inFlight?: number;
}

/** prom-client metrics. */
export interface MetricsOptions {
  /** Where the metrics are registered. @default a Registry of the module's own */
  registry?: Registry;
  /** Prefix of every metric name. @default 'nest_sequence_' */
  prefix?: string;
}

/**
 * OpenTelemetry tracing, through `@opentelemetry/api` (an optional peer): spans are recorded
 * once the application registers an SDK, and cost nothing otherwise. See docs/tracing.md.
 */
export interface TracingOptions {
  /**
   * How a consumer's span relates to the producer's: `'link'` starts it in the consumer's own
   * trace with a link to the producer's span (what the messaging semantic conventions prefer);
   * `'child'` makes it a child of the producer's span, so one trace holds both. @default 'link'
   */
  parent?: 'link' | 'child';
  /**
   * Most links one span carries: a sequence's `process` span links the producer's span and the
   * `receive` spans of its fragments that this instance took, up to this many. @default 32
   */
  maxLinks?: number;
}

/** A periodic job of this instance. */
export interface SweeperOptions {
  /** How often it runs; `false`: never on this instance (another one sweeps). */
  intervalMs?: number | false;
  /** Most items one run takes per store round trip. */
  batchSize?: number;
}

/** Knobs a typical application never touches. */
export interface TuningOptions {
  /** Room left for headers when `sequence.fragmentBytes` is derived from the transport. @default 16384 */
  headerAllowanceBytes?: number;
  /**
   * How long a back-pressured or busy message, or one a store failed on, waits before it is
   * delivered again (at least 1: a message back at once would skip the requeue count).
   * @default 500
   */
  backpressureDelayMs?: number;
  /** How long a sequence's completion lease, or a resequencer key's drain lease, lasts unrenewed. @default 30000 */
  leaseMs?: number;
  /**
   * Longest wait on one step of the sequence store or the resequencer store (a frozen server, a
   * network black hole): the step then fails with `SequenceStoreTimeoutError` or
   * `ResequencerStoreTimeoutError`, as an unreachable store fails it, and the message is
   * requeued. @default 30000
   */
  storeTimeoutMs?: number;
  /**
   * Redeliveries a Claim Check message may have had (its `x-requeue-count`, any requeue counted:
   * a copy waiting on another delivery's lease too) when the payload store or the claim ledger
   * fails on it: then it is dead-lettered `store-unavailable` (at the default
   * backpressureDelayMs, 1200 is about 10 minutes). So is a fragment sent `via: 'claim-check'`
   * whose parked body cannot be read, on any consuming channel, and an inbox message whose record
   * the inbox table refuses. @default 1200
   */
  maxStoreRequeues?: number;
  /** Resequencer hand-offs. */
  drain?: {
    /** Hand-off items a drainer takes per store round trip. @default 32 */
    batchSize?: number;
    /**
     * How long a consumer whose released event another instance is delivering waits for that
     * delivery before it requeues its message, and a gap sweep waits for a key's drain before it
     * goes on with the next key (the drain goes on meanwhile). @default 2000
     */
    waitMs?: number;
  };
  /** The periodic jobs. */
  sweepers?: {
    /** Expires incomplete sequences. @default { intervalMs: 1000, batchSize: 100 } */
    expiry?: SweeperOptions;
    /** Deletes expired and orphaned Claim Check payloads. @default { intervalMs: 60000, batchSize: 500 } */
    orphans?: SweeperOptions;
    /** Applies the Resequencer's gap policies and drains stalled hand-offs. @default { intervalMs: 1000, batchSize: 100 } */
    gaps?: SweeperOptions;
    /** Purges completed outbox and inbox records past their retention. @default { intervalMs: 60000, batchSize: 500 } */
    purge?: SweeperOptions;
  };
}

/**
 * Options of `SequenceModule.forRoot` (and what `forRootAsync`'s factory returns). Every option
 * has a default: with none, everything runs in one process on the embedded adapters.
 *
 * @example
 * SequenceModule.forRoot({
 *   transport: await RabbitMqTransport.connect(process.env.AMQP_URL),
 *   closeTransport: true,
 *   stores: redis(process.env.REDIS_URL, { prefix: 'imaging' }),
 *   sequence: { fragmentBytes: 8 * 1024 * 1024, timeoutMs: 120_000 },
 * })
 */
export interface SequenceModuleOptions {
  /** The broker. @default a new InMemoryTransport (one process, no server) */
  transport?: Transport;
  /**
   * Close `transport` at shutdown, after the module's subscriptions and before its stores (and
   * when its own start fails at bootstrap): for a transport made for this module alone, as
   * `RabbitMqTransport.connect(url)` in `forRootAsync`'s factory. Leave it off for a transport
   * that outlives the application or that several share; close that one yourself.
   * @default false (the default in-memory transport is closed either way)
   */
  closeTransport?: boolean;
  /**
   * Stores of a backend over one connection, from a preset: `redis(url, { prefix })`,
   * `postgres(url)`, or both in a list (the first set that has a store wins). A pattern's own
   * `store` option takes precedence. The module closes the sets at shutdown.
   * @default the embedded stores
   */
  stores?: StoreSet | readonly StoreSet[];
  /** How every message the module sends is published. */
  publish?: PublishPolicy;
  /**
   * Retries of a failing handler, for every decorator that does not set its own; then the
   * message or sequence is dead-lettered (an inbox record is kept `FAILED`: see `outbox`).
   * @default { attempts: 3, baseDelayMs: 200, maxDelayMs: 30000 }
   */
  handlerRetry?: RetryPolicy;
  /**
   * Longest one handler call may run, for every decorator that does not set its own: past it the
   * call is abandoned (its `AbortSignal` aborted, its late result ignored) and counts as a failed
   * attempt, so a handler that never returns cannot hold its message, lease and prefetch slot
   * for ever. Off by default: how long a handler may rightly take (reading a 512 MiB payload,
   * a slow downstream) only the application knows. @default undefined (no limit)
   */
  handlerTimeoutMs?: number | false;
  /** Unsettled messages a consumer holds at once, for every decorator that does not set its own. @default 16 */
  prefetch?: number;
  /**
   * At shutdown, how long deliveries in progress may take to finish before subscriptions close
   * (their messages are then delivered again). It also bounds the wait for each store (or store
   * set) the module closes, at least a second: one still closing then (its server stopped
   * answering) is left to end on its own, with a warning. @default 10000
   */
  shutdownTimeoutMs?: number;
  /** prom-client metrics; `false` turns them off. @default a Registry of the module's own */
  metrics?: false | MetricsOptions;
  /**
   * OpenTelemetry spans of the module (see docs/tracing.md); `false`: none (the trace
   * context of a span of yours that is active when the module sends still travels).
   * @default { parent: 'link', maxLinks: 32 }
   */
  tracing?: false | TracingOptions;
  /** Identifies this instance in leases. @default `<hostname>-<pid>-<random>` */
  consumerId?: string;
  /** Message Sequence: its store, fragment size, limits and expiry. */
  sequence?: MessageSequenceOptions;
  /** Claim Check: payload store, claim ledger, ticket keys, size rules, retention. */
  claimCheck?: ClaimCheckOptions;
  /** Resequencer: its store and buffer bounds. */
  resequencer?: ResequencerOptions;
  /**
   * Transactional Outbox / Inbox: the database, relays and inbox processors. Giving it (even
   * `{}`) starts them at bootstrap; an `@InboxHandler` does too.
   */
  outbox?: OutboxOptions;
  /** Knobs a typical application never touches. */
  tuning?: TuningOptions;
}
