import { Inject, Injectable, Logger, type OnModuleInit } from '@nestjs/common';
import { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { SequenceHandlerConflictError } from '../core/errors/sequence-handler-conflict.error';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import {
  MESSAGE_TYPE_PATTERN,
  type OutboxCommand,
  type OutboxEvent,
} from '../outbox/outbox-message';
import type { InboxContext, InboxHandlerOptions } from '../outbox/inbox-handler.options';
import { OUTBOX_OPTIONS } from '../outbox/outbox.constants';
import {
  defaultCommandChannel,
  defaultEventChannel,
  type ResolvedOutboxOptions,
} from '../outbox/outbox.options';
import { ClaimCheckRegistry } from './claim-check.registry';
import { decoratedMethods } from './decorated-methods';
import { INBOX_HANDLER_METADATA } from './inbox-handler.decorator';
import { InboxHandlerRegistry } from './inbox-handler.registry';
import { ResequencerRegistry } from './resequencer.registry';
import { SequencedHandlerRegistry } from './sequenced-handler.registry';

const DECORATOR = '@InboxHandler';

/** Finds `@InboxHandler` methods on singleton providers and registers them. */
@Injectable()
export class InboxHandlerExplorer implements OnModuleInit {
  private readonly logger = new Logger('Inbox');

  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly reflector: Reflector,
    private readonly registry: InboxHandlerRegistry,
    @Inject(OUTBOX_OPTIONS) private readonly options: ResolvedOutboxOptions,
    private readonly sequenceHandlers: SequencedHandlerRegistry,
    private readonly claimChecks: ClaimCheckRegistry,
    private readonly resequencers: ResequencerRegistry,
  ) {}

  onModuleInit(): void {
    const methods = decoratedMethods<InboxHandlerOptions>(
      this.discovery,
      this.scanner,
      this.reflector,
      INBOX_HANDLER_METADATA,
      DECORATOR,
      this.logger,
    );
    for (const { className, methodName, options, call } of methods) {
      const name = `${className}.${methodName}`;
      const { kind, type, channel } = this.resolve(name, options);
      this.refuseTakenChannel(channel, name);
      this.registry.add({
        name,
        kind,
        type,
        channel,
        processInTransaction: options.processInTransaction === true,
        handle: (message: OutboxEvent | OutboxCommand, context: InboxContext) =>
          call(message, context),
      });
    }
  }

  private resolve(
    name: string,
    options: InboxHandlerOptions,
  ): { kind: 'event' | 'command'; type: string; channel: string } {
    const where = `${DECORATOR} on ${name}`;
    const hasEvent = options.event !== undefined;
    const hasCommand = options.command !== undefined;
    if (hasEvent === hasCommand) {
      throw new SequenceOptionsError(where, [
        "name exactly one of `event: '<EventType>'` or `command: '<CommandType>'`",
      ]);
    }
    const kind = hasEvent ? 'event' : 'command';
    const type: unknown = hasEvent ? options.event : options.command;
    const problems: string[] = [];
    if (typeof type !== 'string' || !MESSAGE_TYPE_PATTERN.test(type)) {
      problems.push(`${kind} must be a type name (letters, digits, _ . : -), got ${String(type)}`);
    }
    if (
      options.channel !== undefined &&
      (typeof options.channel !== 'string' || !options.channel)
    ) {
      problems.push('channel must be a non-empty string');
    }
    if (kind === 'command' && options.channel === undefined && !this.options.serviceName) {
      problems.push(
        "a command handler consumes commands.<serviceName>: set `outbox: { serviceName: '...' }` " +
          'in SequenceModule.forRoot (or give the handler a channel)',
      );
    }
    if (problems.length > 0) throw new SequenceOptionsError(where, problems);
    const channel =
      options.channel ??
      (kind === 'event'
        ? defaultEventChannel({ type: type as string })
        : defaultCommandChannel({ targetService: this.options.serviceName! }));
    return { kind, type: type as string, channel };
  }

  /** A channel consumed by another kind of handler (sequence, claim check, resequencer) is refused. */
  private refuseTakenChannel(channel: string, name: string): void {
    const taken =
      this.sequenceHandlers.get(channel)?.name ??
      this.claimChecks.all().find((each) => each.consumer.channel === channel)?.name ??
      this.resequencers
        .all()
        .find((each) => each.subscribed && each.resequencer.definition.channel === channel)
        ?.definedBy;
    if (taken) throw new SequenceHandlerConflictError(channel, taken, name);
  }
}
