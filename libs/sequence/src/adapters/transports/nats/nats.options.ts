import { MAX_TIMER_MS } from '../../../core/async';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import { definedOnly } from '../../../core/objects';
import { checkOptionKeys, type OptionKeysOf } from '../../../core/option-keys';
import { prefetchProblem } from '../../../ports/transport.port';
import { unsafeSocketTricksProblem } from '../../socket-tricks.guard';
import { isValidJetStreamName } from './nats.naming';

export interface NatsTransportOptions {
  /**
   * Largest message (body plus the port's `headerBytes`) `publish` accepts. At most the server's
   * `max_payload` less the room the transport's own headers take; the default is that much.
   * @default the server's max_payload minus 256 bytes
   */
  readonly maxMessageBytes?: number;
  /**
   * How long `publish` waits for the stream's `PubAck` when the caller gives no `timeoutMs`,
   * retries included (each with the same `Nats-Msg-Id`, so that the stream keeps one copy).
   * @default 10000
   */
  readonly publishTimeoutMs?: number;
  /** Unsettled messages per subscription when `subscribe` is given no `prefetch`. @default 16 */
  readonly prefetch?: number;
  /**
   * Most bytes one pull request of a subscription may bring: a pull asks for as many messages as
   * fit when each is as large as the server's `max_payload` (at least one, at most the free
   * `prefetch` slots). The server sends what a pull asks for as fast as it can, and cuts a
   * connection that leaves more than its `max_pending` (64 MiB by default) unread as a slow
   * consumer; keep the subscriptions of one connection times this well under it. A large
   * `prefetch` (a broker-held sequence's window) is then filled over several pulls.
   * @default 16777216 (16 MiB: 16 messages a pull at the default max_payload of 1 MiB)
   */
  readonly pullMaxBytes?: number;
  /**
   * The consumer's `ack_wait`: how long a delivery may stay unsettled before the server delivers
   * it again. The transport sends in-progress acks (`working()`) every third of it while a
   * handler runs or a delayed requeue waits, so a long handler is not overtaken by a redelivery.
   * At least 500.
   * @default 30000
   */
  readonly ackWaitMs?: number;
  /**
   * The consumer's `max_deliver`. A message whose handler still asks to requeue it at its last
   * delivery is dead-lettered instead (`x-death-reason: max-deliver: …`). Dead-letter channels'
   * consumers have no limit.
   * @default 1000
   */
  readonly maxDeliver?: number;
  /**
   * Delay of the `nak` for a plain `requeue` (or a throwing handler): this times 2^(deliveries-1),
   * up to {@link NatsTransportOptions.maxNakDelayMs}, so that retries do not use up
   * `maxDeliver` in milliseconds. 0 redelivers at once (after 1 ms: a `nak` without a delay is
   * not counted as a redelivery by nats-server 2.9).
   * @default 20
   */
  readonly nakDelayMs?: number;
  /** Longest `nak` delay for a plain `requeue`. @default 5000 */
  readonly maxNakDelayMs?: number;
  /** Suffix of each channel's dead-letter channel. @default '.dlq' */
  readonly deadLetterSuffix?: string;
  /** Prefix of every stream name the transport declares (see nats.naming). @default 'NSEQ_' */
  readonly streamPrefix?: string;
  /** Name of the durable pull consumer on each stream. @default 'nest-sequence' */
  readonly durableName?: string;
  /**
   * The streams' `duplicate_window`: how long JetStream remembers a `Nats-Msg-Id`. Must exceed
   * `publishTimeoutMs`, or a retry after it could be stored twice.
   * @default 120000
   */
  readonly duplicateWindowMs?: number;
  /**
   * The reply stream's `max_age`: a reply nobody has acked within this time is removed. Applies
   * when the transport creates the stream (an existing one is used as it is). Must exceed
   * `publishTimeoutMs`: it bounds the reply stream's duplicate window.
   * @default 3600000 (one hour)
   */
  readonly replyMaxAgeMs?: number;
  /**
   * The reply stream's `max_bytes`: past it, the oldest replies are removed (`discard: old`).
   * Applies when the transport creates the stream.
   * @default 268435456 (256 MiB)
   */
  readonly replyMaxBytes?: number;
  /**
   * Partitioned channels: how long a subscriber's claim on a partition lasts without renewal
   * (the lease stream's `max_age`). The owner renews it once a quarter of this has passed; when
   * its process is lost, another subscriber takes the partition over at most this long (plus a
   * tenth of it) later. Partition consumers' `ack_wait` is the lesser of half of this and
   * `ackWaitMs`, so that the lost owner's messages are back by then. Applies when the transport
   * creates a channel's lease stream; an existing one's `max_age` is used as it is.
   * @default 10000
   */
  readonly partitionLeaseMs?: number;
  /**
   * Has the connection receive each message payload of 64 KiB or more into one buffer of the
   * size its message line announced, as the socket's reads come, instead of the client's growing
   * buffer (which starts small and doubles: for a 1 MiB payload about 3.6 MiB of new memory and two
   * to three copies of each byte). A payload whose message was released
   * (`InboundMessage.releaseBody`, as broker-held reassembly does once it spooled it) is reused
   * for a later payload of the connection, so it must not be read after the release. It applies
   * to the transport's connection, one you pass to the constructor included, and to its parser
   * after every reconnect.
   *
   * It relies on the client's internals (it wraps the parser of the connection's protocol
   * handler, `protocol.parser`, and replaces its payload buffer's memory), written for
   * `@nats-io/nats-core` 3.x: on any other version it logs a warning and stays off. Off, the
   * transport uses the client's public API only.
   * @default false
   */
  readonly unsafeSocketTricks?: boolean;
}

const NATS_TRANSPORT_KEYS = {
  maxMessageBytes: true,
  publishTimeoutMs: true,
  prefetch: true,
  pullMaxBytes: true,
  ackWaitMs: true,
  maxDeliver: true,
  nakDelayMs: true,
  maxNakDelayMs: true,
  deadLetterSuffix: true,
  streamPrefix: true,
  durableName: true,
  duplicateWindowMs: true,
  replyMaxAgeMs: true,
  replyMaxBytes: true,
  partitionLeaseMs: true,
  unsafeSocketTricks: true,
} as const satisfies OptionKeysOf<NatsTransportOptions>;

export type ResolvedNatsTransportOptions = Required<Omit<NatsTransportOptions, 'maxMessageBytes'>> &
  Pick<NatsTransportOptions, 'maxMessageBytes'>;

export const NATS_TRANSPORT_DEFAULTS: ResolvedNatsTransportOptions = {
  publishTimeoutMs: 10_000,
  prefetch: 16,
  pullMaxBytes: 16 * 1024 * 1024,
  ackWaitMs: 30_000,
  maxDeliver: 1_000,
  nakDelayMs: 20,
  maxNakDelayMs: 5_000,
  deadLetterSuffix: '.dlq',
  streamPrefix: 'NSEQ_',
  durableName: 'nest-sequence',
  duplicateWindowMs: 120_000,
  replyMaxAgeMs: 3_600_000,
  replyMaxBytes: 256 * 1024 * 1024,
  partitionLeaseMs: 10_000,
  unsafeSocketTricks: false,
};

/**
 * Shortest `ackWaitMs`: in-progress acks go out every third of it but at most every 100 ms, so
 * that close to that, one late tick of their timer would see a running handler's message
 * delivered again.
 */
export const MIN_ACK_WAIT_MS = 500;

/** Shortest `partitionLeaseMs`: a pull request lasts at least a second. */
export const MIN_PARTITION_LEASE_MS = 1_000;

/** Fills in defaults; throws `SequenceOptionsError` listing every invalid option. */
export function resolveNatsTransportOptions(
  options: NatsTransportOptions = {},
): ResolvedNatsTransportOptions {
  const resolved = { ...NATS_TRANSPORT_DEFAULTS, ...definedOnly(options) };
  const problems: string[] = [];
  checkOptionKeys(problems, options, NATS_TRANSPORT_KEYS);
  if (resolved.maxMessageBytes !== undefined && !isInteger(resolved.maxMessageBytes, 1)) {
    problems.push(
      `maxMessageBytes must be a positive integer, got ${String(resolved.maxMessageBytes)}`,
    );
  }
  for (const key of ['publishTimeoutMs', 'ackWaitMs', 'maxNakDelayMs'] as const) {
    const min = key === 'ackWaitMs' ? MIN_ACK_WAIT_MS : 1;
    if (!isInteger(resolved[key], min) || resolved[key] > MAX_TIMER_MS) {
      problems.push(
        `${key} must be an integer of milliseconds from ${min} to ${MAX_TIMER_MS}, got ${String(resolved[key])}`,
      );
    }
  }
  if (!isInteger(resolved.nakDelayMs, 0) || resolved.nakDelayMs > MAX_TIMER_MS) {
    problems.push(
      `nakDelayMs must be an integer of milliseconds from 0 to ${MAX_TIMER_MS}, got ${String(resolved.nakDelayMs)}`,
    );
  }
  if (!isInteger(resolved.maxDeliver, 2)) {
    problems.push(
      `maxDeliver must be an integer of at least 2, got ${String(resolved.maxDeliver)}`,
    );
  }
  if (!isInteger(resolved.duplicateWindowMs, 1)) {
    problems.push(
      `duplicateWindowMs must be a positive integer of milliseconds, got ${String(resolved.duplicateWindowMs)}`,
    );
  } else if (
    isInteger(resolved.publishTimeoutMs, 1) &&
    resolved.duplicateWindowMs <= resolved.publishTimeoutMs
  ) {
    problems.push(
      `duplicateWindowMs (${resolved.duplicateWindowMs}) must exceed publishTimeoutMs ` +
        `(${resolved.publishTimeoutMs}): a publish retried after the window could be stored twice`,
    );
  }
  if (!isInteger(resolved.replyMaxAgeMs, 1)) {
    problems.push(
      `replyMaxAgeMs must be a positive integer of milliseconds, got ${String(resolved.replyMaxAgeMs)}`,
    );
  } else if (
    isInteger(resolved.publishTimeoutMs, 1) &&
    resolved.replyMaxAgeMs <= resolved.publishTimeoutMs
  ) {
    // The reply stream's duplicate window is at most replyMaxAgeMs: every reply would be refused.
    problems.push(
      `replyMaxAgeMs (${resolved.replyMaxAgeMs}) must exceed publishTimeoutMs ` +
        `(${resolved.publishTimeoutMs}): the reply stream's duplicate window is at most ` +
        'replyMaxAgeMs, and a publish that may be retried after it is refused, so no reply ' +
        'could be sent',
    );
  }
  if (!isInteger(resolved.pullMaxBytes, 1)) {
    problems.push(`pullMaxBytes must be a positive integer, got ${String(resolved.pullMaxBytes)}`);
  }
  if (!isInteger(resolved.replyMaxBytes, 1)) {
    problems.push(
      `replyMaxBytes must be a positive integer, got ${String(resolved.replyMaxBytes)}`,
    );
  }
  if (
    !isInteger(resolved.partitionLeaseMs, MIN_PARTITION_LEASE_MS) ||
    resolved.partitionLeaseMs > MAX_TIMER_MS
  ) {
    problems.push(
      `partitionLeaseMs must be an integer of milliseconds from ${MIN_PARTITION_LEASE_MS} to ` +
        `${MAX_TIMER_MS}, got ${String(resolved.partitionLeaseMs)}`,
    );
  }
  if (typeof resolved.deadLetterSuffix !== 'string' || resolved.deadLetterSuffix.length === 0) {
    problems.push(`deadLetterSuffix must be a non-empty string such as '.dlq'`);
  }
  if (
    typeof resolved.streamPrefix !== 'string' ||
    !/^[A-Za-z0-9_-]*$/.test(resolved.streamPrefix)
  ) {
    problems.push(`streamPrefix may hold only letters, digits, '_' and '-'`);
  }
  if (typeof resolved.durableName !== 'string' || !isValidJetStreamName(resolved.durableName)) {
    problems.push(`durableName must be a JetStream name: no '.', '*', '>', whitespace or slashes`);
  }
  const prefetch = prefetchProblem(resolved.prefetch);
  if (prefetch) problems.push(prefetch);
  const tricks = unsafeSocketTricksProblem(resolved.unsafeSocketTricks);
  if (tricks) problems.push(tricks);
  if (problems.length > 0) throw new SequenceOptionsError('NatsTransport options', problems);
  return resolved;
}

function isInteger(value: unknown, min: number): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= min;
}
