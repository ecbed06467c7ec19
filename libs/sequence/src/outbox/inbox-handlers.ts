import { Injectable } from '@nestjs/common';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import type { InboxHandlerFunction } from './inbox-handler.options';
import type { BoxName, MessageKind } from '../ports/outbox-store.port';

/** One `@InboxHandler` method of this application. */
export interface RegisteredInboxHandler {
  /** `ClassName.methodName`, for messages. */
  readonly name: string;
  readonly kind: MessageKind;
  readonly type: string;
  readonly channel: string;
  readonly processInTransaction: boolean;
  /** `undefined`: no limit. */
  readonly handlerTimeoutMs: number | undefined;
  readonly handle: InboxHandlerFunction;
}

/** The inbox box that holds messages of `kind`. */
export const inboxOf = (kind: MessageKind): Extract<BoxName, 'inbox_events' | 'inbox_commands'> =>
  kind === 'event' ? 'inbox_events' : 'inbox_commands';

/**
 * The inbox handlers of this application, one per event type and one per command type: what the
 * receiver checks a message's type against, and the processor hands each record to.
 */
@Injectable()
export class InboxHandlers {
  private readonly handlers = new Map<string, RegisteredInboxHandler>();

  add(handler: RegisteredInboxHandler): void {
    const key = `${handler.kind}:${handler.type}`;
    const existing = this.handlers.get(key);
    if (existing) {
      throw new SequenceOptionsError(`@InboxHandler on ${handler.name}`, [
        `${handler.kind} ${handler.type} already has an inbox handler, ${existing.name}; ` +
          'an inbox runs one handler per message id — do both things in one method',
      ]);
    }
    this.handlers.set(key, handler);
  }

  find(kind: MessageKind, type: string): RegisteredInboxHandler | undefined {
    return this.handlers.get(`${kind}:${type}`);
  }

  all(): RegisteredInboxHandler[] {
    return [...this.handlers.values()];
  }

  /** The channels to consume, each with the handlers reading it. */
  channels(): Map<string, RegisteredInboxHandler[]> {
    const channels = new Map<string, RegisteredInboxHandler[]>();
    for (const handler of this.handlers.values()) {
      channels.set(handler.channel, [...(channels.get(handler.channel) ?? []), handler]);
    }
    return channels;
  }

  has(kind: MessageKind): boolean {
    return this.all().some((handler) => handler.kind === kind);
  }
}
