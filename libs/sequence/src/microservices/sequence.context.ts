import { BaseRpcContext } from '@nestjs/microservices';
import { brokerDeathReason } from '../core/broker-death';
import type { HeaderMap } from '../core/headers';
import type { InboundMessage } from '../ports/transport.port';

const DEATH_REASON = 'x-death-reason';

/** What `@Ctx()` tells about the message being handled. */
export interface SequenceMessageInfo {
  readonly pattern: string;
  readonly channel: string;
  readonly headers: Readonly<HeaderMap>;
  /** How the payload came: in one message, as a Message Sequence, behind a ticket, or resequenced. */
  readonly via: 'inline' | 'sequence' | 'ticket' | 'resequenced';
  readonly bytes: number;
  /** Messages it took: a sequence's fragments, else 1. */
  readonly fragments: number;
  readonly sequenceId?: string;
  /** SHA-256 of the payload (lowercase hex), when the sender declared it. */
  readonly sha256?: string;
  readonly contentType?: string;
  /** Resequenced channels: the event's key and sequence number. */
  readonly key?: string;
  readonly seq?: number;
  /**
   * The transport's message whose delivery runs the handler: a sequence's, the fragment that
   * completed it; on a resequenced channel, the message whose arrival released the event (an
   * earlier event may release later ones).
   */
  readonly message?: InboundMessage;
  /** Aborted when the call runs past `handlerTimeoutMs` (see {@link SequenceContext.getSignal}). */
  readonly signal?: AbortSignal;
}

const NEVER_ABORTED = new AbortController().signal;

/**
 * The context `@Ctx()` receives in `@EventPattern` and `@MessagePattern` handlers served by
 * `SequenceServer`: ids, headers, fragment count, the transport's message, and, on a dead-letter
 * channel, the reason a message was dead-lettered.
 */
export class SequenceContext extends BaseRpcContext<[SequenceMessageInfo]> {
  constructor(info: SequenceMessageInfo) {
    super([info]);
  }

  private get info(): SequenceMessageInfo {
    return this.getArgByIndex(0) as SequenceMessageInfo;
  }

  getPattern(): string {
    return this.info.pattern;
  }

  getChannel(): string {
    return this.info.channel;
  }

  getHeaders(): Readonly<HeaderMap> {
    return this.info.headers;
  }

  getVia(): SequenceMessageInfo['via'] {
    return this.info.via;
  }

  getBytes(): number {
    return this.info.bytes;
  }

  getFragments(): number {
    return this.info.fragments;
  }

  getSequenceId(): string | undefined {
    return this.info.sequenceId;
  }

  getSha256(): string | undefined {
    return this.info.sha256;
  }

  getContentType(): string | undefined {
    return this.info.contentType;
  }

  getKey(): string | undefined {
    return this.info.key;
  }

  getSeq(): number | undefined {
    return this.info.seq;
  }

  getMessage(): InboundMessage | undefined {
    return this.info.message;
  }

  /**
   * Aborted when this call runs past `handlerTimeoutMs` (the channel's, or the module's), with a
   * `HandlerTimeoutError` as its `reason`: stop. What the handler returns after that is ignored.
   * Never aborted when no limit is set.
   */
  getSignal(): AbortSignal {
    return this.info.signal ?? NEVER_ABORTED;
  }

  /**
   * In a handler of a dead-letter channel: the `x-death-reason` the message carries (why it was
   * dead-lettered), or for one the broker dead-lettered itself, the broker's reason
   * (`rejected: dead-lettered by RabbitMQ from orders`); otherwise undefined.
   */
  getDeadLetterReason(): string | undefined {
    const all = [this.info.headers, this.info.message?.headers ?? {}];
    for (const headers of all) {
      const value = headers[DEATH_REASON];
      if (typeof value === 'string') return value;
      if (Buffer.isBuffer(value)) return value.toString('utf8');
    }
    for (const headers of all) {
      const reason = brokerDeathReason(headers);
      if (reason !== undefined) return reason;
    }
    return undefined;
  }
}
