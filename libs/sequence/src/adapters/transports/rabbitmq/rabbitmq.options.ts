import { MAX_TIMER_MS } from '../../../core/async';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import { definedOnly } from '../../../core/objects';
import { checkOptionKeys, type OptionKeysOf } from '../../../core/option-keys';
import { prefetchProblem } from '../../../ports/transport.port';
import { unsafeSocketTricksProblem } from '../../socket-tricks.guard';

/** Queue types the transport can declare; both are durable. */
export type RabbitMqQueueType = 'classic' | 'quorum';

export interface RabbitMqTransportOptions {
  /**
   * Type of every queue the transport declares (`x-queue-type`): a channel's queue and its
   * dead-letter queue. Quorum queues are replicated and suit clusters; an existing queue keeps
   * its type, so switching needs the queues deleted first.
   * @default 'classic'
   */
  readonly queueType?: RabbitMqQueueType;
  /**
   * Largest message (body plus the port's `headerBytes`) `publish` accepts; larger ones are
   * refused with `MessageTooLargeError` before anything is sent. Keep it at or below the
   * broker's `max_message_size` (RabbitMQ 3.10 default: 134217728): a message over the broker's
   * limit closes the publishing channel instead of failing cleanly.
   * @default 16777216 (16 MiB)
   */
  readonly maxMessageBytes?: number;
  /**
   * How long `publish` waits for the broker's confirm when the caller gives no `timeoutMs`,
   * including time spent waiting for a lost connection to come back.
   * @default 10000
   */
  readonly publishTimeoutMs?: number;
  /**
   * How long `subscribe`, when connected, waits for its consumer to be registered (its channel
   * opened, its queues declared) before it rejects with `SubscribeError` (`timeout`). Without a
   * connection it resolves at once and starts consuming when one comes.
   * @default 10000
   */
  readonly subscribeTimeoutMs?: number;
  /**
   * Suffix of each channel's dead-letter queue: where `dead-letter` dispositions go when the
   * subscriber names no `deadLetterChannel`, and where the broker itself dead-letters (messages
   * rejected without requeue, expired, or over a quorum queue's delivery limit).
   * @default '.dlq'
   */
  readonly deadLetterSuffix?: string;
  /** Unsettled messages per subscription when `subscribe` is given no `prefetch`. @default 16 */
  readonly prefetch?: number;
  /**
   * Coalesces the connection's frame writes: the transport corks amqplib's socket around each
   * pass of amqplib's frame multiplexer, so the frames of one pass (publishes, acks) leave in one
   * `writev` instead of one system call, and one wake-up of the broker, each. Same bytes, same
   * order. It applies to the connection and to every reconnected one, a golevelup
   * `AmqpConnection` you share included. In the resequencer benchmark it cut the CPU that
   * RabbitMQ and the process spend per event (docs/benchmarks.md).
   *
   * It also has the connection receive each message body of 256 KiB or more into one buffer of
   * its announced size as the frames' bytes are read, instead of amqplib's gathering each frame
   * and then concatenating the frames (two to three new buffers per byte); a body whose message
   * was released (`InboundMessage.releaseBody`, as broker-held reassembly does once it spooled
   * it) is reused for a later body of the connection, so it must not be read after the release.
   *
   * It relies on amqplib's internals (it patches the connection's private multiplexer,
   * `connection.muxer`, and its frame reading, `connection.recvFrame` and `connection.accept`),
   * written for amqplib 0.10.x: on any other version it logs a warning and stays off. Off, the
   * transport uses amqplib's public API only.
   * @default false
   */
  readonly unsafeSocketTricks?: boolean;
}

const RABBITMQ_TRANSPORT_KEYS = {
  queueType: true,
  maxMessageBytes: true,
  publishTimeoutMs: true,
  subscribeTimeoutMs: true,
  deadLetterSuffix: true,
  prefetch: true,
  unsafeSocketTricks: true,
} as const satisfies OptionKeysOf<RabbitMqTransportOptions>;

export type ResolvedRabbitMqTransportOptions = Required<RabbitMqTransportOptions>;

export const RABBITMQ_TRANSPORT_DEFAULTS: ResolvedRabbitMqTransportOptions = {
  queueType: 'classic',
  maxMessageBytes: 16 * 1024 * 1024,
  publishTimeoutMs: 10_000,
  subscribeTimeoutMs: 10_000,
  deadLetterSuffix: '.dlq',
  prefetch: 16,
  unsafeSocketTricks: false,
};

/** Fills in defaults; throws `SequenceOptionsError` listing every invalid option. */
export function resolveRabbitMqTransportOptions(
  options: RabbitMqTransportOptions = {},
): ResolvedRabbitMqTransportOptions {
  const resolved = { ...RABBITMQ_TRANSPORT_DEFAULTS, ...definedOnly(options) };
  const problems: string[] = [];
  checkOptionKeys(problems, options, RABBITMQ_TRANSPORT_KEYS);
  if (resolved.queueType !== 'classic' && resolved.queueType !== 'quorum') {
    problems.push(`queueType must be 'classic' or 'quorum', got ${String(resolved.queueType)}`);
  }
  if (!isPositiveInteger(resolved.maxMessageBytes)) {
    problems.push(
      `maxMessageBytes must be a positive integer (at most the broker's max_message_size), got ${String(resolved.maxMessageBytes)}`,
    );
  }
  // Publishes wait on a timer: past its range each one would fail (or time out at once).
  for (const key of ['publishTimeoutMs', 'subscribeTimeoutMs'] as const) {
    if (!isPositiveInteger(resolved[key]) || resolved[key] > MAX_TIMER_MS) {
      problems.push(
        `${key} must be an integer of milliseconds from 1 to ${MAX_TIMER_MS}, got ${String(resolved[key])}`,
      );
    }
  }
  if (typeof resolved.deadLetterSuffix !== 'string' || resolved.deadLetterSuffix.length === 0) {
    problems.push(`deadLetterSuffix must be a non-empty string such as '.dlq'`);
  }
  const prefetch = prefetchProblem(resolved.prefetch);
  if (prefetch) problems.push(prefetch);
  const tricks = unsafeSocketTricksProblem(resolved.unsafeSocketTricks);
  if (tricks) problems.push(tricks);
  if (problems.length > 0) throw new SequenceOptionsError('RabbitMqTransport options', problems);
  return resolved;
}

function isPositiveInteger(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 1;
}
