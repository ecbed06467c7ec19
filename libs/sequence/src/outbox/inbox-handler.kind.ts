import { Inject, Injectable } from '@nestjs/common';
import type { OutboxCommand, OutboxEvent } from '../core/outbox-message';
import {
  INBOX_HANDLER_METADATA,
  type InboxHandlerOptions,
} from '../discovery/inbox-handler.decorator';
import type { ChannelBinding, HandlerKind } from '../kernel/channel-binding';
import type { DecoratedMethod } from '../kernel/decorated-methods';
import { RESOLVED_OPTIONS } from '../kernel/tokens';
import type { ResolvedOptions } from '../options/resolved-options';
import { resolveInboxHandler } from '../options/resolve-outbox';
import type { InboxContext } from './inbox-handler.options';
import { InboxHandlers, inboxOf } from './inbox-handlers';
import { OutboxRuntime } from './outbox.runtime';

const DECORATOR = '@InboxHandler';

/**
 * `@InboxHandler` methods: one per event or command type. Handlers of several types may share a
 * channel (commands to one service do): the channel is consumed once, and each message is
 * recorded in its inbox, then handed to the handler of its type.
 */
@Injectable()
export class InboxHandlerKind implements HandlerKind<InboxHandlerOptions> {
  readonly decorator = DECORATOR;
  readonly metadataKey = INBOX_HANDLER_METADATA;

  constructor(
    @Inject(RESOLVED_OPTIONS) private readonly options: ResolvedOptions,
    private readonly handlers: InboxHandlers,
    private readonly runtime: OutboxRuntime,
  ) {}

  bind({
    className,
    methodName,
    options,
    call,
  }: DecoratedMethod<InboxHandlerOptions>): ChannelBinding[] {
    const name = `${className}.${methodName}`;
    const { kind, type, channel, handlerTimeoutMs } = resolveInboxHandler(
      `${DECORATOR} on ${name}`,
      options,
      this.options.outbox,
      this.options.handlerTimeoutMs,
    );
    this.handlers.add({
      name,
      kind,
      type,
      channel,
      processInTransaction: options.processInTransaction === true,
      handlerTimeoutMs,
      handle: (message: OutboxEvent | OutboxCommand, context: InboxContext) =>
        call(message, context),
    });
    return [
      {
        channel,
        kind: DECORATOR,
        definedBy: name,
        shared: true,
        prefetch: this.options.outbox.boxes[inboxOf(kind)].prefetch,
        receive: (message) => this.runtime.receiveInbox(message),
        describe: 'consumes inbox messages from',
      },
    ];
  }
}
