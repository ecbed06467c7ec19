import { MAX_TIMER_MS } from '../core/async';
import { textOf } from '../core/errors/caught';
import { InvalidHeaderError } from '../core/errors/invalid-header.error';
import { MessageTooLargeError } from '../core/errors/message-too-large.error';
import { SequenceHeader, type HeaderMap } from '../core/headers';
import { partitionsProblem } from '../core/partition';
import type { DeadLetterBox } from './dead-letter-box.port';
import { assertEncodableHeaders } from './transport-headers';

const DEATH_REASON_HEADER = SequenceHeader.deathReason;

/** A message as a subscriber receives it. */
export interface InboundMessage {
  /** The channel (queue) it was consumed from. */
  readonly channel: string;
  readonly body: Buffer;
  /** Headers as the transport delivered them; values are not trusted (parse them). */
  readonly headers: Readonly<Record<string, unknown>>;
  /**
   * True when the transport delivered this message before: after a `requeue` (with or without
   * `delayMs`), a thrown handler, or a lost or closed consumer.
   */
  readonly redelivered: boolean;
  /**
   * The partition it was consumed from, from 0, for a subscription with `partitions` (see
   * {@link Transport.partitioned}); `channel` is then the partitioned channel's name. Undefined
   * for a message of a plain channel.
   */
  readonly partition?: number;
  /**
   * Drops the transport's own reference to `body`, for a handler that keeps the message unsettled
   * for long and has put its body elsewhere (broker-held reassembly spools it): the broker still
   * holds the message whole, so held messages then cost the process no memory. Afterwards `body`
   * is empty, and a `dead-letter` or a `requeue` with `delayMs` must give the body back in the
   * disposition's `body`; without it the transport returns the message to its queue instead (a
   * plain requeue: the broker delivers it again whole; NATS JetStream reads it back from the
   * stream only at the message's last allowed delivery). Offered by transports whose broker keeps unsettled messages (RabbitMQ, NATS
   * JetStream); undefined elsewhere. The caller must keep no reference to the released `Buffer`
   * either: a transport may write a later message's body into it (RabbitMQ and NATS JetStream
   * with `unsafeSocketTricks`). A second call does nothing.
   */
  readonly releaseBody?: () => void;
  /**
   * Aborted once this delivery can no longer be settled here: its subscription closed, or the
   * broker took the subscription's unsettled messages back (a lost channel, RabbitMQ's
   * `consumer_timeout`, a NATS partition lease that lapsed). The broker delivers the message
   * again, to this subscriber or another, and a verdict given afterwards is ignored. A handler
   * that holds messages unsettled for long (broker-held reassembly) drops what it held when it
   * fires. One signal serves every delivery of a subscription's broker channel; undefined where
   * the transport cannot tell.
   */
  readonly abandoned?: AbortSignal;
}

/**
 * What a handler decided about a message:
 * - `ack`: done, remove it;
 * - `requeue` without `delayMs`: "try again now": it goes back at (or near) the head of the
 *   channel, so it may well be the next message delivered. Never use it for back-pressure: a
 *   message that is always requeued this way keeps coming back first.
 * - `requeue` with `delayMs`: "retry later, behind what is queued" (back-pressure): after the
 *   delay it goes to the tail of the channel, so messages published after it are delivered first;
 * - `dead-letter`: move it to the dead-letter channel with `x-death-reason: reason`.
 */
export type Disposition =
  | { readonly action: 'ack' }
  | {
      readonly action: 'requeue';
      readonly delayMs?: number;
      readonly reason?: string;
      /** The body to put at the tail, for a message whose body was released (`releaseBody`). */
      readonly body?: Buffer;
    }
  | {
      readonly action: 'dead-letter';
      readonly reason: string;
      /** The body to dead-letter, for a message whose body was released (`releaseBody`). */
      readonly body?: Buffer;
    };

/** Decides a message's fate. A handler that throws is treated as `requeue` with no delay. */
export type MessageHandler = (message: InboundMessage) => Promise<Disposition>;

export interface PublishOptions {
  /** Reject with `PublishTimeoutError` when the broker has not confirmed within this time. */
  readonly timeoutMs?: number;
  /**
   * Whether the transport may send the message again by itself within `timeoutMs` (after a lost
   * connection, a closed channel, or a return as unroutable). `false`: it is sent at most once
   * per call, and a publish that is not confirmed fails instead. For callers that keep several
   * publishes in flight in an order of their own: each resending on its own could overtake
   * another. @default true
   */
  readonly resend?: boolean;
  /**
   * Publish to one partition of a partitioned channel (see {@link Transport.partitioned}):
   * partition `index` of the channel split into `count`. Only on transports with `partitioned`;
   * others reject the publish with a RangeError.
   */
  readonly partition?: PartitionAddress;
}

/** One partition of a channel split into `count`: `index` from 0 to `count - 1`. */
export interface PartitionAddress {
  readonly index: number;
  readonly count: number;
}

export interface SubscribeOptions {
  /** Most unsettled messages delivered to this subscriber at once. @default 16 */
  readonly prefetch?: number;
  /** Where `dead-letter` dispositions go. @default `transport.deadLetterChannel(channel)` */
  readonly deadLetterChannel?: string;
  /**
   * Subscribe to every partition of a channel split into this many (see
   * {@link Transport.partitioned}) instead of the channel itself. `prefetch` then applies per
   * partition. Only on transports with `partitioned`; others reject the subscribe.
   */
  readonly partitions?: number;
}

export interface Subscription {
  readonly channel: string;
  /** Stops delivery; messages delivered but not yet settled are redelivered to others. */
  close(): Promise<void>;
}

export interface ReplyChannelOptions {
  /** Most unsettled replies in the handler's hands at once. @default 16 */
  readonly prefetch?: number;
}

/**
 * Port: a message broker with point-to-point channels (queues).
 *
 * Contract, checked by the transport conformance suite:
 * - `publish` resolves only once the broker has taken responsibility for the message (publisher
 *   confirm). It rejects with `PublishRejectedError` when the broker refuses the message (a
 *   negative confirm), with `MessageTooLargeError` when body plus headers exceed
 *   `maxMessageBytes`, with `InvalidHeaderError` for headers the adapter cannot encode (nothing
 *   sent), and with `PublishTimeoutError` after `timeoutMs`. A publish the transport's or the
 *   broker's configuration refuses before anything is sent, so that no retry can change it,
 *   rejects with an error marked {@link FinalRefusal}. Bodies travel byte-exact;
 *   header values (string, number, boolean) keep their type and value.
 * - Publishes with `resend: false` to one channel, made one after another without waiting for
 *   the earlier ones' confirms, reach it in the order they were made, but for those that fail;
 *   none is sent twice by the transport (a Resequencer's `outputInFlight` relies on it).
 * - A channel holds messages until a subscriber settles them; messages published before anyone
 *   subscribed are delivered once someone does. Subscribers of one channel compete: each message
 *   goes to one of them at a time.
 * - The handler's {@link Disposition} settles the message. A requeued message is delivered again,
 *   to any subscriber, with its body and headers and `redelivered: true`:
 *   - a plain `requeue` (no `delayMs`), or a handler that throws, puts it back at once, at or near
 *     the head of the channel: it may be the very next delivery. Its order relative to other
 *     messages is not part of the contract.
 *   - a `requeue` with `delayMs` puts it back no sooner than `delayMs` later, at the tail of the
 *     channel, with {@link REQUEUE_COUNT_HEADER} incremented. A message that is always requeued
 *     this way does not starve the messages behind it. Whether it keeps one of the subscriber's
 *     `prefetch` slots during the delay is the adapter's choice (see each adapter).
 * - `dead-letter` publishes the message to the dead-letter channel with its body and headers
 *   preserved, plus `x-death-reason` and without {@link REQUEUE_COUNT_HEADER} (see
 *   `deadLetterHeaders`), before the original is removed. Without a `deadLetterChannel` at
 *   subscribe, that is {@link Transport.deadLetterChannel}.
 * - Closing a subscription (or losing the consumer) redelivers its unsettled messages.
 * - At most `prefetch` unsettled messages are in a subscriber's hands at once.
 */
export interface Transport {
  /** Short name for logs and health checks (`in-memory`, `rabbitmq`). */
  readonly name: string;
  /**
   * Largest message (body plus headers) the broker accepts: a positive safe integer above the
   * module's `tuning.headerAllowanceBytes`, or the module refuses the transport at bootstrap.
   */
  readonly maxMessageBytes: number;
  /**
   * Optional: the longest `timeoutMs` a publish may be given, when the transport cannot retry a
   * publish for longer without the broker storing it twice (NATS JetStream: below the duplicate
   * window of the streams it declares). The module refuses a `publish.confirmTimeoutMs` above it
   * at bootstrap, and a value that is not a positive integer. Left out: no limit.
   */
  readonly maxPublishTimeoutMs?: number;
  /**
   * Whether the transport has partitioned channels: `publish` with `partition`, `subscribe` with
   * `partitions`. A partitioned channel is split into `count` partitions, each a queue of its own
   * beside the channel's plain queue. Contract, checked by the partitioned-channel conformance
   * suite:
   * - A message published to partition `index` is delivered to subscribers with `partitions:
   *   count`, never to the plain channel's subscribers, and vice versa.
   * - At any moment each partition has at most one active subscriber across every process (the
   *   broker's single active consumer, or the transport's own lease): all its messages go to that
   *   subscriber, in the order they were published, up to `prefetch` unsettled at once. When that
   *   subscriber closes or its process is lost, another subscriber takes the partition over and
   *   gets the unsettled messages again (`redelivered: true`). Each delivery tells its
   *   `partition`; its `channel` is the channel's own name.
   * - A subscriber may keep messages unsettled for as long as it lives (a handler whose promise
   *   is pending): the transport does not give them to another subscriber meanwhile (each adapter
   *   documents the broker limit on that time, such as RabbitMQ's `consumer_timeout`). Past that
   *   limit, or when the connection drops, the subscriber's consumer is lost and its unsettled
   *   messages are redelivered, to another subscriber in line or, once it consumes again, to this
   *   one: the verdicts on the earlier deliveries are then ignored, and only the latest delivery
   *   of a message settles it.
   * - A `requeue` with `delayMs` puts the message at the tail of its own partition; `dead-letter`
   *   sends it to the channel's dead-letter channel, as for a plain channel.
   * - The partition count is part of the channel's topology: a publish or subscribe with a count
   *   other than the one the channel was declared with rejects with `PartitionCountMismatchError`.
   */
  readonly partitioned?: boolean;
  publish(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    options?: PublishOptions,
  ): Promise<void>;
  subscribe(
    channel: string,
    handler: MessageHandler,
    options?: SubscribeOptions,
  ): Promise<Subscription>;
  /**
   * Where this transport dead-letters messages of `channel` when the subscriber named no
   * `deadLetterChannel`: the channel a sweeper or an operator should use for the same purpose.
   */
  deadLetterChannel(channel: string): string;
  /** Resolves when the broker is reachable now; rejects saying why not (for health checks). */
  ping(): Promise<void>;
  /** Closes every subscription and the connection; idempotent. */
  close(): Promise<void>;
  /**
   * Opens a private, temporary channel on which this subscriber alone receives replies. The
   * returned Subscription's `channel` is the name any process on the same broker passes to
   * `publish()` to reach it. Closing it (or the transport, or losing the process) removes the channel.
   * Transports that cannot route replies leave this undefined.
   *
   * Contract, checked by the reply-channel conformance suite:
   * - A reply published with `publish(subscription.channel, body, headers)` reaches the handler
   *   byte-exact with its headers. `publish` resolves on the broker's confirm and takes messages
   *   up to `maxMessageBytes`, as for any channel, so a large reply travels as a Message Sequence
   *   (many fragments): they all arrive, not necessarily in order.
   * - Dispositions: `ack` removes the reply; `requeue` (with or without `delayMs`) delivers it
   *   again on the same reply channel, as on any channel. A reply channel has no dead-letter
   *   channel: `dead-letter` drops the reply, with a logged warning that names the reason.
   * - Each call opens a channel of its own, with a name no other call returns; no reply channel
   *   sees another's messages. Names start with a prefix each transport reserves for them (see
   *   docs/transports.md); do not use that prefix for channels of your own.
   * - Once the subscription is closed nothing more is delivered, and a publish to its channel
   *   neither delivers nor waits past its `timeoutMs`: it rejects with `PublishRejectedError` where
   *   the broker tells that nobody can take it (in-memory, RabbitMQ), and resolves otherwise
   *   (NATS JetStream, where the reply is stored and discarded).
   * - A process that ends without closing leaves nothing behind on the broker that grows for
   *   ever: what it declared for its replies is removed by the broker, at once or after a bounded
   *   time.
   */
  openReplyChannel?(handler: MessageHandler, options?: ReplyChannelOptions): Promise<Subscription>;
  /**
   * Whether `channel` is a name `openReplyChannel` hands out (of its reserved prefix): a server
   * sends a reply only to such a channel, never to one a request names that holds other work.
   * Transports with `openReplyChannel` implement it.
   */
  isReplyChannel?(channel: string): boolean;
  /**
   * Dead letters the transport dropped so far to stay within bounds of its own (the in-memory
   * transport keeps a bounded number per dead-letter channel). Transports whose broker keeps dead
   * letters leave this undefined. The module reports it as a metric.
   */
  droppedDeadLetters?(): number;
  /**
   * Calls `listener` for each dead letter the transport stores on its own, once the broker
   * confirmed it: not one given as a `dead-letter` disposition (the module counts those), but one
   * of the transport's own limits, such as NATS JetStream's `max_deliver` (`max-deliver: …`).
   * `channel` is the channel the message came from. Returns a function that stops telling it.
   * The module counts them in `dead_letters_total`. Transports that dead-letter nothing on their
   * own (or whose broker does it unseen) leave this undefined.
   */
  onDeadLetter?(listener: (channel: string, reason: string) => void): () => void;
  /**
   * Browsing, replaying and discarding the dead letters this transport holds (the operator
   * console). Undefined where the transport cannot.
   */
  deadLetters?(): DeadLetterBox;
}

/**
 * A handler's verdict as adapters settle it: anything that is not a well-formed disposition
 * (a handler returning nothing, say) counts as a plain `requeue`, never as an ack.
 */
export function toDisposition(outcome: unknown): Disposition {
  const candidate = (outcome ?? {}) as {
    action?: unknown;
    reason?: unknown;
    delayMs?: unknown;
    body?: unknown;
  };
  if (candidate.action === 'ack') return { action: 'ack' };
  const body = Buffer.isBuffer(candidate.body) ? { body: candidate.body } : {};
  if (candidate.action === 'dead-letter') {
    const reason =
      typeof candidate.reason === 'string' ? candidate.reason : 'dead-lettered by the handler';
    return { action: 'dead-letter', reason, ...body };
  }
  if (candidate.action !== 'requeue') return { action: 'requeue', delayMs: undefined };
  return {
    action: 'requeue',
    delayMs: requeueDelay(candidate.delayMs),
    ...(typeof candidate.reason === 'string' ? { reason: candidate.reason } : {}),
    ...body,
  };
}

/**
 * True for the `publish` rejections no retry can change: the message is larger than the
 * transport's `maxMessageBytes`, or its headers cannot be encoded. Sent again, it would be refused
 * the same way.
 */
export function isUnsendable(error: unknown): boolean {
  return error instanceof MessageTooLargeError || error instanceof InvalidHeaderError;
}

/**
 * The mark of an error a transport's `publish` rejects with when it refused the publish before
 * sending anything, for a reason of configuration that no retry can change (NATS JetStream: a
 * stream whose `duplicate_window` the publish's `timeoutMs` reaches, a stream it cannot declare).
 * See {@link isFinalRefusal}.
 */
export interface FinalRefusal {
  readonly finalRefusal: true;
}

/**
 * True for a `publish` rejection marked {@link FinalRefusal}: nothing was sent, and sending again
 * would be refused the same way until the configuration changes. Unlike a message no transport
 * can send (too large, headers it cannot encode), the message itself is fine: a caller fails the
 * publish at once, with the transport's error, and keeps the message (requeues it, reports the
 * failure) rather than dead-lettering it.
 */
export function isFinalRefusal(error: unknown): boolean {
  return (
    typeof error === 'object' &&
    error !== null &&
    (error as Partial<FinalRefusal>).finalRefusal === true
  );
}

/**
 * The checks a transport makes before it sends anything: headers it can encode, and body plus
 * headers within `maxMessageBytes`. Throws what `publish` then rejects with (see
 * {@link isUnsendable}).
 */
export function assertSendable(
  channel: string,
  body: Buffer,
  headers: HeaderMap,
  maxMessageBytes: number,
): void {
  assertEncodableHeaders(channel, headers);
  const bytes = body.length + headerBytes(headers);
  if (bytes > maxMessageBytes) throw new MessageTooLargeError(channel, bytes, maxMessageBytes);
}

/**
 * A publish's confirm timeout: `given` (the call's `timeoutMs`) or the transport's default,
 * refused with a RangeError unless it is a timer's range of milliseconds.
 */
export function publishTimeoutMs(
  channel: string,
  given: number | undefined,
  fallback: number,
): number {
  const timeoutMs = given ?? fallback;
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0 || timeoutMs > MAX_TIMER_MS) {
    throw new RangeError(
      `publish to ${channel}: timeoutMs must be a number of milliseconds from 1 to ` +
        `${MAX_TIMER_MS}, got ${timeoutMs}`,
    );
  }
  return timeoutMs;
}

/**
 * A requeue's `delayMs` as transports can wait it: not a number (or NaN) means none, a negative
 * one 0, and one beyond a timer's range (Infinity included) that range, rather than a timer that
 * fires at once and turns back-pressure into a busy loop.
 */
function requeueDelay(delayMs: unknown): number | undefined {
  if (typeof delayMs !== 'number' || Number.isNaN(delayMs)) return undefined;
  return Math.min(Math.max(delayMs, 0), MAX_TIMER_MS);
}

/**
 * The conventional dead-letter channel of a channel, `<channel>.dlq`: what the in-memory transport
 * uses. Prefer {@link Transport.deadLetterChannel}, which knows the transport's own naming.
 */
export function defaultDeadLetterChannel(channel: string): string {
  return `${channel}.dlq`;
}

/**
 * Header a transport sets on a message it put back behind the queued ones (a `requeue` with
 * `delayMs`): how many times that has happened to it so far.
 */
export const REQUEUE_COUNT_HEADER = 'x-requeue-count';

/** Unsettled replies per reply channel when `openReplyChannel` is given no `prefetch`. */
export const DEFAULT_REPLY_PREFETCH = 16;

/**
 * The warning a transport logs when a handler dead-letters a reply: a reply channel has no
 * dead-letter channel, so the reply is dropped.
 */
export function droppedReplyWarning(channel: string, reason: string): string {
  return (
    `dropped a reply of ${channel} its handler dead-lettered (${reason}): ` +
    `reply channels have no dead-letter channel`
  );
}

/**
 * The largest `prefetch` a subscription takes: RabbitMQ's `basic.qos` prefetch count is an
 * unsigned 16-bit number (0 would mean unlimited). Every transport keeps to it, so that options
 * that work on the embedded transport work on the broker.
 */
export const MAX_PREFETCH = 65_535;

/** Why a subscription's `prefetch` is unusable on every transport, or undefined when it is fine. */
export function prefetchProblem(prefetch: unknown): string | undefined {
  const usable =
    typeof prefetch === 'number' &&
    Number.isSafeInteger(prefetch) &&
    prefetch >= 1 &&
    prefetch <= MAX_PREFETCH;
  return usable
    ? undefined
    : `prefetch must be an integer from 1 to ${MAX_PREFETCH}, got ${String(prefetch)}`;
}

/**
 * Why `partition` is not a partition a publish can address (a count from 1 to `MAX_PARTITIONS`, an
 * index from 0 to `count - 1`), or undefined when it is.
 */
export function partitionAddressProblem(partition: PartitionAddress): string | undefined {
  const { index, count } = partition;
  return (
    partitionsProblem(count) ??
    (Number.isSafeInteger(index) && index >= 0 && index < count
      ? undefined
      : `partition index must be an integer from 0 to ${count - 1}, got ${String(index)}`)
  );
}

/** How many delayed requeues `headers` record; 0 when none (or when the value is not a count). */
export function requeueCount(headers: Readonly<Record<string, unknown>>): number {
  return countIn(headers[REQUEUE_COUNT_HEADER]);
}

/**
 * A count a header carries (a positive integer, as a number or decimal text), else 0: a value
 * of any other shape, such as an object that `Number()` cannot convert, counts none.
 */
export function countIn(raw: unknown): number {
  const value = typeof raw === 'number' ? raw : typeof raw === 'string' ? Number(raw) : 0;
  return Number.isSafeInteger(value) && value > 0 ? value : 0;
}

/** A copy of `headers` for one more delayed requeue. */
export function withRequeueCount<T extends Readonly<Record<string, unknown>>>(
  headers: T,
): T & { [REQUEUE_COUNT_HEADER]: number } {
  return { ...headers, [REQUEUE_COUNT_HEADER]: requeueCount(headers) + 1 };
}

/**
 * The headers of a message's dead letter: its own, with `x-death-reason`, without the transport's
 * `x-requeue-count` (the count of its life in its queue: republished from the dead-letter queue,
 * it starts afresh, rather than being dead-lettered again at its first requeue).
 */
export function deadLetterHeaders(
  headers: Readonly<Record<string, unknown>>,
  reason: string,
): Record<string, unknown> {
  const { [REQUEUE_COUNT_HEADER]: _count, ...own } = headers;
  return { ...own, [DEATH_REASON_HEADER]: reason };
}

/**
 * Rough size of a header map on the wire: what `maxMessageBytes` must also hold. Total: a value
 * `String()` cannot convert (another program's table with a field named `toString`) is measured
 * by its JSON.
 */
export function headerBytes(headers: HeaderMap): number {
  let bytes = 0;
  for (const [name, value] of Object.entries(headers)) {
    bytes += Buffer.byteLength(name) + Buffer.byteLength(textOf(value)) + 8;
  }
  return bytes;
}
