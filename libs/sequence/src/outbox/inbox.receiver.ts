import type { Logger } from '@nestjs/common';
import { InvalidOutboxMessageError } from '../core/errors/invalid-outbox-message.error';
import { deathReason } from '../core/errors/rejection-code';
import { errorMessage } from '../core/errors/caught';
import { strictUtf8, unstorableText } from '../core/unicode';
import { inboxOf, type InboxHandlers } from './inbox-handlers';
import type { OutboxMetrics } from './outbox.metrics';
import type { BoxLifecycle } from './outbox.events';
import type { MessageKind, NewBoxRecord, OutboxStore } from '../ports/outbox-store.port';
import type { Disposition, InboundMessage } from '../ports/transport.port';
import { storeRequeuesSpent } from '../kernel/store-requeues';
import {
  MESSAGE_ID_HEADER,
  MESSAGE_KIND_HEADER,
  parseMessage,
  partitionOf,
} from './outbox-message.codec';
import type { OutboxEvent } from '../core/outbox-message';

/** What an inbox receiver takes from `tuning`. */
export interface InboxReceiverTuning {
  /** How long a message waits before redelivery when the inbox table cannot be written. */
  readonly backpressureDelayMs: number;
  /** Redeliveries of one message (any requeue counted) before a store failure dead-letters it. */
  readonly maxStoreRequeues: number;
}

/**
 * Takes messages off the inbox channels and records each in its inbox by id, then acks it: the
 * broker's copy is let go only once the database has it. A message whose id the inbox already
 * holds is acked and dropped (a duplicate). Processing happens after, in the inbox processor
 * (woken at once). A message that is not a valid event or command, or whose type no handler of
 * this application takes, is dead-lettered with the reason.
 */
export class InboxReceiver {
  constructor(
    private readonly store: OutboxStore,
    private readonly handlers: InboxHandlers,
    private readonly metrics: OutboxMetrics,
    private readonly logger: Logger,
    /** Called after a record was added to a box (to wake its processor). */
    private readonly onAdded: (kind: MessageKind) => void,
    private readonly lifecycle: BoxLifecycle,
    private readonly tuning: InboxReceiverTuning,
  ) {}

  /** Records one message; exported for users who consume with their own subscriber. */
  async receive(input: InboundMessage): Promise<Disposition> {
    // A subscriber of your own may hand over a message without headers (amqplib says none so).
    const message: InboundMessage =
      input.headers !== null && typeof input.headers === 'object'
        ? input
        : { ...input, headers: {} };
    let record: NewBoxRecord;
    try {
      record = this.recordOf(message);
    } catch (error) {
      const code =
        error instanceof NoInboxHandler
          ? ('no-inbox-handler' as const)
          : ('invalid-inbox-message' as const);
      if (code === 'invalid-inbox-message') {
        const kind = kindOf(message) ?? 'event';
        this.metrics.receivedOne(inboxOf(kind), 'invalid');
      }
      const reason = deathReason(code, errorMessage(error));
      this.logger.warn(`dead-lettering a message from ${message.channel}: ${reason}`);
      return { action: 'dead-letter', reason };
    }
    const box = inboxOf(record.kind);
    try {
      const result = await this.store.receive(box, record);
      this.metrics.receivedOne(box, result);
      if (result === 'duplicate') this.lifecycle.duplicate(message.channel, record);
      if (result === 'added') this.onAdded(record.kind);
      return { action: 'ack' };
    } catch (error) {
      const problem = errorMessage(error);
      // An outage this long, or an error no retry will fix (a value the database refuses): out
      // of the way, with the reason, rather than back for ever.
      const spent = storeRequeuesSpent(
        message.headers,
        `inbox ${box} could not record ${record.id}`,
        problem,
        this.tuning.maxStoreRequeues,
      );
      if (spent !== undefined) {
        const reason = deathReason('store-unavailable', spent);
        this.logger.error(`dead-lettering a message from ${message.channel}: ${reason}`);
        return { action: 'dead-letter', reason };
      }
      this.logger.warn(`inbox ${box} could not record ${record.id} (${problem}); will retry`);
      return {
        action: 'requeue',
        delayMs: this.tuning.backpressureDelayMs,
        reason: 'inbox store unavailable',
      };
    }
  }

  private recordOf(message: InboundMessage): NewBoxRecord {
    const kind = kindOf(message);
    if (!kind) {
      throw new InvalidOutboxMessageError('event', [
        `${MESSAGE_KIND_HEADER} must be "event" or "command" (and the body the message as JSON)`,
      ]);
    }
    // Decoded leniently, bytes that are not UTF-8 would become U+FFFD: two ids differing in
    // them would be one, and the second message a "duplicate".
    const body = strictUtf8(message.body);
    if (body === undefined) {
      throw new InvalidOutboxMessageError(kind, ['the body is not UTF-8 (JSON on the wire is)']);
    }
    const parsed = parseMessage(kind, body);
    const headerId = message.headers[MESSAGE_ID_HEADER];
    if (headerId !== undefined && headerId !== parsed.id) {
      throw new InvalidOutboxMessageError(
        kind,
        [`${MESSAGE_ID_HEADER} ${JSON.stringify(headerId)} differs from the body's id`],
        parsed.id,
      );
    }
    if (!this.handlers.find(kind, parsed.type))
      throw new NoInboxHandler(kind, parsed.type, message.channel);
    return {
      id: parsed.id,
      kind,
      type: parsed.type,
      partitionKey: kind === 'event' ? partitionOf(parsed as OutboxEvent) : null,
      body,
      headers: stringHeaders(message.headers),
    };
  }
}

class NoInboxHandler extends Error {
  constructor(kind: MessageKind, type: string, channel: string) {
    super(
      `no @InboxHandler for ${kind} ${type} (received on ${channel}); add one, or route it elsewhere`,
    );
  }
}

function kindOf(message: InboundMessage): MessageKind | undefined {
  const kind = message.headers[MESSAGE_KIND_HEADER];
  return kind === 'event' || kind === 'command' ? kind : undefined;
}

/**
 * Headers a broker or transport adds on a dead-lettering: `x-death-reason`, and RabbitMQ's
 * `x-first-death-*` and `x-last-death-*` on a message replayed from a dead-letter queue.
 */
const BROKER_HEADER_PREFIXES = ['x-death', 'x-first-death-', 'x-last-death-'] as const;

/** The string-valued headers (what the inbox keeps); the transport's own are left out. */
function stringHeaders(headers: Readonly<Record<string, unknown>>): Record<string, string> {
  const kept: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (
      typeof value === 'string' &&
      // Neither database stores a NUL, nor PostgreSQL's jsonb a lone surrogate: such a header
      // would make the whole message unrecordable, requeued until it is dead-lettered.
      unstorableText(value) === undefined &&
      unstorableText(name) === undefined &&
      !BROKER_HEADER_PREFIXES.some((prefix) => name.startsWith(prefix)) &&
      name !== 'x-requeue-count'
    ) {
      kept[name] = value;
    }
  }
  return kept;
}
