import { createHash } from 'node:crypto';
import type { JsMsg, StoredMsg } from '@nats-io/jetstream';

/** What a subscription tells the server of a delivery. */
export type NatsVerdict =
  | { readonly kind: 'ack' }
  /** Delivered again once `delayMs` has passed. */
  | { readonly kind: 'nak'; readonly delayMs: number }
  /** In progress: the server restarts the delivery's `ack_wait`. */
  | { readonly kind: 'working' }
  /** Never delivered again; `reason` goes to the server's advisory. */
  | { readonly kind: 'term'; readonly reason: string };

export const ACK: NatsVerdict = { kind: 'ack' };
export const WORKING: NatsVerdict = { kind: 'working' };

export function nak(delayMs: number): NatsVerdict {
  return { kind: 'nak', delayMs };
}

export function term(reason: string): NatsVerdict {
  return { kind: 'term', reason };
}

/**
 * A JetStream delivery as far as settling it goes, for a subscription that may keep messages
 * unsettled for long: without its body where it can be (the stream keeps the message, so the
 * process need not).
 *
 * Such a delivery is settled by JetStream's acknowledgement protocol: a plain publish of `+ACK`,
 * `-NAK {"delay":…}`, `+WPI` or `+TERM …` to its ack subject, what the client's `JsMsg` sends
 * itself. The client does not expose that subject, but it is made of the delivery's info
 * (`$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<timestamp>.<pending>`,
 * the form nats-server sends without a JetStream domain). A delivery in any other form (a domain,
 * an account hash) keeps its `JsMsg` and is settled through it.
 */
export interface NatsDelivery {
  /** How many times the server has delivered it, this time included. */
  readonly deliveryCount: number;
  /** Its sequence in the stream: where its body can be read again. */
  readonly streamSequence: number;
  /**
   * The stored message it is, the same on every delivery: its stream, sequence and the time it
   * was stored (a stream made again starts its sequences over).
   */
  readonly stored: string;
  /** Its ack subject, where it is known from its info. */
  readonly ackSubject?: string;
  /** The message itself, where its ack subject is not known. */
  readonly message?: JsMsg;
}

export function deliveryOf(message: JsMsg): NatsDelivery {
  const info = message.info;
  const { deliveryCount, streamSequence } = info;
  const plain = !info.domain && !info.account_hash;
  const stored = messageKey(info.stream, streamSequence, String(message.timestampNanos));
  return plain
    ? {
        deliveryCount,
        streamSequence,
        stored,
        ackSubject:
          `$JS.ACK.${info.stream}.${info.consumer}.${deliveryCount}.${streamSequence}.` +
          `${info.deliverySequence}.${message.timestampNanos}.${info.pending}`,
      }
    : { deliveryCount, streamSequence, stored, message };
}

/**
 * The key of a message read from its stream (a stream made again starts its sequences over): the
 * {@link NatsDelivery.stored} of its deliveries, so that what is forwarded of it keyed either way
 * carries one `Nats-Msg-Id`.
 */
export function storedKey(
  stream: string,
  stored: Pick<StoredMsg, 'seq' | 'time' | 'timestamp'>,
): string {
  const nanos = epochNanos(stored.timestamp);
  return messageKey(stream, stored.seq, nanos ?? `${stored.time.getTime()}ms`);
}

function messageKey(stream: string, sequence: number, storedNanos: string): string {
  return `${stream}:${sequence}:${storedNanos}`;
}

/**
 * Nanoseconds since the epoch of a time as JetStream writes a stored message's (RFC 3339 with up
 * to nine digits of fraction, `2026-12-06T15:04:05.123456789Z`): what the message's deliveries
 * carry in their ack subject. Undefined for another form.
 */
export function epochNanos(time: string): string | undefined {
  const parts = /^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$/.exec(time);
  if (!parts) return undefined;
  const ms = Date.parse(`${parts[1]}${parts[3]}`);
  if (Number.isNaN(ms)) return undefined;
  return String(BigInt(ms) * 1_000_000n + BigInt((parts[2] ?? '').padEnd(9, '0')));
}

/**
 * A `Nats-Msg-Id` for what the transport forwards of a stored message on its own (`kind`: a dead
 * letter), the same on every delivery of it (`stored`: {@link NatsDelivery.stored}, or another key
 * of the stored message), shaped and sized as the UUID the forwards' headers make room for.
 */
export function forwardMsgId(kind: string, stored: string): string {
  const hex = createHash('sha256').update(`${kind}:${stored}`).digest('hex');
  return [
    hex.slice(0, 8),
    hex.slice(8, 12),
    hex.slice(12, 16),
    hex.slice(16, 20),
    hex.slice(20, 32),
  ].join('-');
}

const encoder = new TextEncoder();

/** The verdict as JetStream's acknowledgement protocol spells it. */
export function encodeVerdict(verdict: NatsVerdict): Uint8Array {
  switch (verdict.kind) {
    case 'ack':
      return encoder.encode('+ACK');
    case 'working':
      return encoder.encode('+WPI');
    case 'nak':
      return encoder.encode(
        `-NAK ${JSON.stringify({ delay: Math.max(0, Math.round(verdict.delayMs)) * 1_000_000 })}`,
      );
    case 'term':
      return encoder.encode(verdict.reason ? `+TERM ${verdict.reason}` : '+TERM');
  }
}

/** Sends `verdict`: to the ack subject with `publish`, or through the message it was kept with. */
export function sendVerdict(
  delivery: NatsDelivery,
  verdict: NatsVerdict,
  publish: (subject: string, payload: Uint8Array) => void,
): void {
  if (delivery.ackSubject !== undefined) {
    publish(delivery.ackSubject, encodeVerdict(verdict));
    return;
  }
  const message = delivery.message!;
  switch (verdict.kind) {
    case 'ack':
      return message.ack();
    case 'working':
      return message.working();
    case 'nak':
      return message.nak(verdict.delayMs);
    case 'term':
      return message.term(verdict.reason);
  }
}
