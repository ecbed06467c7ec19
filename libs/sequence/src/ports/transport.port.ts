import type { HeaderMap } from '../core/headers';

/** A message as a subscriber receives it. */
export interface InboundMessage {
  /** The channel (queue) it was consumed from. */
  readonly channel: string;
  readonly body: Buffer;
  /** Headers as the transport delivered them; values are not trusted (parse them). */
  readonly headers: Readonly<Record<string, unknown>>;
  /** True when the transport delivered this message before (after a nack or a consumer loss). */
  readonly redelivered: boolean;
}

/**
 * What a handler decided about a message:
 * - `ack`: done, remove it;
 * - `requeue`: put it back for redelivery, after `delayMs` if given (back-pressure);
 * - `dead-letter`: move it to the channel's dead-letter channel with `x-death-reason: reason`.
 */
export type Disposition =
  | { readonly action: 'ack' }
  | { readonly action: 'requeue'; readonly delayMs?: number; readonly reason?: string }
  | { readonly action: 'dead-letter'; readonly reason: string };

/** Decides a message's fate. A handler that throws is treated as `requeue` with no delay. */
export type MessageHandler = (message: InboundMessage) => Promise<Disposition>;

export interface PublishOptions {
  /** Reject with `PublishTimeoutError` when the broker has not confirmed within this time. */
  readonly timeoutMs?: number;
}

export interface SubscribeOptions {
  /** Most unsettled messages delivered to this subscriber at once. @default 16 */
  readonly prefetch?: number;
  /** Where `dead-letter` dispositions go. @default `<channel>.dlq` */
  readonly deadLetterChannel?: string;
}

export interface Subscription {
  readonly channel: string;
  /** Stops delivery; messages delivered but not yet settled are redelivered to others. */
  close(): Promise<void>;
}

/**
 * Port: a message broker with point-to-point channels (queues).
 *
 * Contract, checked by the transport conformance suite:
 * - `publish` resolves only once the broker has taken responsibility for the message (publisher
 *   confirm); it rejects on a nack, on `MessageTooLargeError` when body plus headers exceed
 *   `maxMessageBytes`, and on `PublishTimeoutError` after `timeoutMs`. Bodies travel byte-exact;
 *   header values (string, number, boolean) keep their type and value.
 * - A channel holds messages until a subscriber settles them; messages published before anyone
 *   subscribed are delivered once someone does. Subscribers of one channel compete: each message
 *   goes to one of them at a time.
 * - The handler's {@link Disposition} settles the message. A thrown error means `requeue`.
 *   Requeued messages are delivered again, with `redelivered: true`, to any subscriber.
 * - `dead-letter` publishes the message to the dead-letter channel with its body and headers
 *   preserved, plus `x-death-reason`, before the original is removed.
 * - Closing a subscription (or losing the consumer) redelivers its unsettled messages.
 * - At most `prefetch` unsettled messages are in a subscriber's hands at once.
 */
export interface Transport {
  /** Short name for logs and health checks (`in-memory`, `rabbitmq`). */
  readonly name: string;
  /** Largest message (body plus headers) the broker accepts. */
  readonly maxMessageBytes: number;
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
  /** Resolves when the broker is reachable now; rejects saying why not (for health checks). */
  ping(): Promise<void>;
  /** Closes every subscription and the connection; idempotent. */
  close(): Promise<void>;
}

/**
 * A handler's verdict as adapters settle it: anything that is not a well-formed disposition
 * (a handler returning nothing, say) counts as a plain `requeue`, never as an ack.
 */
export function toDisposition(outcome: unknown): Disposition {
  const candidate = (outcome ?? {}) as { action?: unknown; reason?: unknown; delayMs?: unknown };
  if (candidate.action === 'ack') return { action: 'ack' };
  if (candidate.action === 'dead-letter') {
    const reason =
      typeof candidate.reason === 'string' ? candidate.reason : 'dead-lettered by the handler';
    return { action: 'dead-letter', reason };
  }
  const delayMs = typeof candidate.delayMs === 'number' ? candidate.delayMs : undefined;
  return { action: 'requeue', delayMs: candidate.action === 'requeue' ? delayMs : undefined };
}

/** The default dead-letter channel of a channel. */
export function defaultDeadLetterChannel(channel: string): string {
  return `${channel}.dlq`;
}

/** Rough size of a header map on the wire: what `maxMessageBytes` must also hold. */
export function headerBytes(headers: HeaderMap): number {
  let bytes = 0;
  for (const [name, value] of Object.entries(headers)) {
    bytes += Buffer.byteLength(name) + Buffer.byteLength(String(value)) + 8;
  }
  return bytes;
}
