import type { Logger } from '@nestjs/common';
import type { StoredMsg } from '@nats-io/jetstream';
import { errorMessage } from '../../../core/errors/caught';
import { MessageTooLargeError } from '../../../core/errors/message-too-large.error';
import { SequenceHeader } from '../../../core/headers';
import { deadLetterHeaders } from '../../../ports/transport.port';
import { forwardableHeaders } from '../../../ports/transport-headers';
import type { NatsConnection } from './nats.client';
import { forwardMsgId, storedKey } from './nats.acks';
import { readHeaders } from './nats.headers';

/** Where nats-server tells that a consumer stopped delivering a message at its `max_deliver`. */
export const MAX_DELIVERIES_ADVISORY = '$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES';
/** Most advisories waiting to be acted on; past it, the message is reported and left. */
const MAX_WAITING = 10_000;
/** Attempts at moving one message, a pause apart, before it is left in the stream. */
const ATTEMPTS = 5;
const PAUSE_MS = 1_000;

export interface NatsDeliveryLimitSettings {
  readonly channel: string;
  /** The stream and durable consumer whose advisories are watched. */
  readonly stream: string;
  readonly consumer: string;
  readonly deadLetterChannel: string;
  readonly connection: NatsConnection;
  /** The message at `sequence` of the stream, or undefined when it is gone. */
  readonly read: (sequence: number) => Promise<StoredMsg | undefined>;
  /** Publishes the dead letter with the given `Nats-Msg-Id`, its headers cut to fit. */
  readonly publish: (
    body: Buffer,
    headers: Record<string, unknown>,
    msgId: string,
  ) => Promise<{ readonly duplicate: boolean }>;
  /** Deletes the message at `sequence` from the stream; false when it was not there. */
  readonly remove: (sequence: number) => Promise<boolean>;
  /** A dead letter this watch stored (not a duplicate of another process's). */
  readonly deadLettered: (reason: string) => void;
  readonly logger: Logger;
  /** How long one publish may take, retries included (the transport's `publishTimeoutMs`). */
  readonly publishTimeoutMs: number;
  /**
   * The dead-letter stream's `duplicate_window` as the server reports it (an existing stream may
   * have a shorter one than the transport's `duplicateWindowMs`); asked before each try. One
   * publish is sent again only within it, for at most the window less 1 ms.
   */
  readonly duplicateWindowMs: () => number;
}

/**
 * Dead-letters the messages a consumer stopped delivering at its `max_deliver` without anyone
 * settling their last delivery: a subscriber that crashed or lost its lease holding it, or whose
 * dead letter could not be published. nats-server then leaves the message in the work-queue
 * stream, never delivered again, and tells so in a `MAX_DELIVERIES` advisory (core NATS: heard by
 * whoever listens at that moment, which a subscriber pulling from the consumer does).
 *
 * On each advisory the message is read from the stream, published to the dead-letter channel
 * (headers kept, `x-death-reason: max-deliver: …`) with a `Nats-Msg-Id` of the stream, sequence
 * and time, then deleted from the stream: every subscriber of the channel hears the advisory, and
 * the dead-letter stream stores their publishes once (within its duplicate window); only the one
 * stored is told to `deadLettered`. One message is moved at a time. A message whose dead letter
 * does not fit `max_payload` even with its headers cut, or that could not be moved in
 * {@link ATTEMPTS} tries, is left in the stream and logged as an error naming its stream and
 * sequence: the server never delivers it again, and nothing else removes it. No try starts that
 * could reach the server after the dead-letter stream's duplicate window from the first one:
 * a try whose confirm was lost may have stored the dead letter, and the server would store a
 * later one again.
 */
export class NatsDeliveryLimitWatch {
  private subscription?: { unsubscribe(): void };
  private readonly waiting: Array<{ sequence: number; deliveries: number }> = [];
  private running?: Promise<void>;
  private stopped = false;
  /** Whether the server refused the advisories' subscription (reported once). */
  private refused = false;

  constructor(private readonly settings: NatsDeliveryLimitSettings) {}

  start(): void {
    const { stream, consumer, connection } = this.settings;
    this.subscription = connection.subscribe(`${MAX_DELIVERIES_ADVISORY}.${stream}.${consumer}`, {
      callback: (error, message) => {
        if (!error) {
          // A throw here would reach the client's reader loop, which stops reading the whole
          // connection: no advisory, however malformed, may throw.
          try {
            this.heard(message);
          } catch (thrown) {
            this.settings.logger.warn(
              `${this.settings.channel}: ignored a ${MAX_DELIVERIES_ADVISORY} advisory: ` +
                errorMessage(thrown),
            );
          }
          return;
        }
        // A permission refused, most often: nothing given up by the server is moved then.
        if (this.refused) return;
        this.refused = true;
        this.settings.logger.error(
          `${this.settings.channel}: cannot hear the server's ${MAX_DELIVERIES_ADVISORY} ` +
            `advisories for consumer ${consumer} of stream ${stream} (${errorMessage(error)}): ` +
            'a message whose last allowed delivery is left unsettled will stay in the stream, ' +
            'not dead-lettered; allow this connection to subscribe to $JS.EVENT.ADVISORY.>',
        );
      },
    });
  }

  /** Stops listening, and waits for the move under way (those waiting are left). */
  async stop(): Promise<void> {
    this.stopped = true;
    this.subscription?.unsubscribe();
    for (const { sequence } of this.waiting.splice(0)) {
      this.left(sequence, undefined, 'its subscription closed first');
    }
    await this.running;
  }

  private heard(message: unknown): void {
    let advisory: unknown;
    try {
      advisory = (message as { json(): unknown }).json();
    } catch {
      return;
    }
    // Only the server's advisory for this consumer moves a message: anything else published on
    // the subject (a JSON null, an array, another consumer's advisory) is ignored.
    if (!isAdvisoryFor(advisory, this.settings.stream, this.settings.consumer)) return;
    const sequence = advisory.stream_seq;
    if (typeof sequence !== 'number' || !Number.isSafeInteger(sequence) || sequence < 1) return;
    const deliveries = typeof advisory.deliveries === 'number' ? advisory.deliveries : 0;
    if (this.stopped) return;
    if (this.waiting.length >= MAX_WAITING) {
      this.left(sequence, undefined, `${MAX_WAITING} others wait to be moved`);
      return;
    }
    this.waiting.push({ sequence, deliveries });
    this.running ??= this.drain();
  }

  private async drain(): Promise<void> {
    try {
      for (let next = this.waiting.shift(); next; next = this.waiting.shift()) {
        await this.move(next.sequence, next.deliveries);
      }
    } finally {
      this.running = undefined;
    }
  }

  private async move(sequence: number, deliveries: number): Promise<void> {
    const { channel, stream, deadLetterChannel } = this.settings;
    const reason =
      `max-deliver: delivered ${deliveries} times (the consumer's max_deliver), the last ` +
      'delivery left unsettled (its subscriber stopped, or its dead letter was not stored)';
    let headers: Record<string, unknown> | undefined;
    // When the first publish started: the window within which the server drops a second copy.
    let firstPublish: number | undefined;
    for (let attempt = 1; ; attempt++) {
      try {
        const stored = await this.settings.read(sequence);
        // Gone: another subscriber moved it, or an operator deleted it.
        if (!stored) return;
        // Headers the client cannot read are left out: the dead letter says so.
        const read = readHeaders(() => stored.header);
        headers = read.headers;
        const why =
          read.problem === undefined
            ? reason
            : `${reason}; its NATS headers cannot be read (${read.problem}), left out`;
        const letter = forwardableHeaders(deadLetterHeaders(headers, why), [
          SequenceHeader.deathReason,
        ]);
        const data = stored.data;
        const body = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
        // Sized as the forwards' headers make room for (a longer id could push a message of
        // maxMessageBytes over the limit), and the id of the dead letter a subscription sends
        // at the message's last delivery: one whose term was lost is not stored again here.
        const msgId = forwardMsgId('dead-letter', storedKey(stream, stored));
        const now = performance.now();
        firstPublish ??= now;
        const windowMs = this.settings.duplicateWindowMs();
        // How long this try may go on sending: the publish stops resending within the window.
        const tryMs = Math.min(this.settings.publishTimeoutMs, windowMs - 1);
        if (now + tryMs > firstPublish + windowMs) {
          this.left(
            sequence,
            headers,
            `${reason}; one more try could be stored after the dead-letter stream's duplicate ` +
              `window (${windowMs} ms), a second copy of one an earlier try may have stored ` +
              `without its confirm: look in ${deadLetterChannel} first`,
          );
          return;
        }
        const { duplicate } = await this.settings.publish(body, letter, msgId);
        await this.settings
          .remove(sequence)
          .catch((error: unknown) =>
            this.settings.logger.error(
              `message ${sequence} of ${channel} was dead-lettered to ${deadLetterChannel} (${reason}) ` +
                `but could not be deleted from stream ${stream}: ${errorMessage(error)}; ` +
                'delete it there, it is not delivered again',
            ),
          );
        if (!duplicate) this.settings.deadLettered(reason);
        return;
      } catch (error) {
        if (error instanceof MessageTooLargeError || attempt >= ATTEMPTS || this.stopped) {
          this.left(sequence, headers, `${reason}; ${errorMessage(error)}`);
          return;
        }
        await new Promise((resolve) => setTimeout(resolve, PAUSE_MS).unref());
      }
    }
  }

  /** Logs a message the server no longer delivers and that could not be dead-lettered. */
  private left(
    sequence: number,
    headers: Readonly<Record<string, unknown>> | undefined,
    why: string,
  ): void {
    const { channel, stream, deadLetterChannel } = this.settings;
    this.settings.logger.error(
      `message ${sequence} of ${channel}${describeSequence(headers)} reached its max_deliver and ` +
        `could not be dead-lettered to ${deadLetterChannel} (${why}): it stays in stream ` +
        `${stream} at sequence ${sequence}, never delivered again; read it with ` +
        `\`nats stream get ${stream} ${sequence}\`, then republish it smaller or delete it`,
    );
  }
}

interface DeliveriesAdvisory {
  readonly stream: string;
  readonly consumer: string;
  readonly stream_seq?: unknown;
  readonly deliveries?: unknown;
}

/** Whether `advisory` is a JSON object naming `stream` and `consumer`, as the server's do. */
function isAdvisoryFor(
  advisory: unknown,
  stream: string,
  consumer: string,
): advisory is DeliveriesAdvisory {
  if (typeof advisory !== 'object' || advisory === null || Array.isArray(advisory)) return false;
  const named = advisory as Partial<DeliveriesAdvisory>;
  return named.stream === stream && named.consumer === consumer;
}

/** ` (sequence <id>, position <n>)` from a fragment's headers, or nothing. */
export function describeSequence(headers: Readonly<Record<string, unknown>> | undefined): string {
  const text = (value: unknown) =>
    typeof value === 'string' || typeof value === 'number' ? String(value) : undefined;
  const id = text(headers?.[SequenceHeader.id]);
  if (id === undefined) return '';
  const position = text(headers?.[SequenceHeader.position]);
  return ` (sequence ${id}${position === undefined ? '' : `, position ${position}`})`;
}
