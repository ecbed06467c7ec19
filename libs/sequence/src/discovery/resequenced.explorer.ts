import { Injectable, Logger, type OnModuleInit } from '@nestjs/common';
import { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { SequenceHandlerConflictError } from '../core/errors/sequence-handler-conflict.error';
import { ResequencerService } from '../resequencer/resequencer.service';
import type { ResequencerDefinition } from '../resequencer/resequencer.options';
import type { ResequencedEvent } from '../resequencer/resequenced-event';
import { ClaimCheckRegistry } from './claim-check.registry';
import { decoratedMethods } from './decorated-methods';
import { RESEQUENCED_METADATA } from './resequenced.decorator';
import { ResequencerRegistry } from './resequencer.registry';
import { SequencedHandlerRegistry } from './sequenced-handler.registry';

const DECORATOR = '@Resequenced';

/** Finds `@Resequenced` methods on singleton providers and defines their resequencers. */
@Injectable()
export class ResequencedExplorer implements OnModuleInit {
  private readonly logger = new Logger('Resequencer');

  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly reflector: Reflector,
    private readonly resequencers: ResequencerService,
    private readonly registry: ResequencerRegistry,
    private readonly sequenceHandlers: SequencedHandlerRegistry,
    private readonly claimChecks: ClaimCheckRegistry,
  ) {}

  onModuleInit(): void {
    const methods = decoratedMethods<ResequencerDefinition>(
      this.discovery,
      this.scanner,
      this.reflector,
      RESEQUENCED_METADATA,
      DECORATOR,
      this.logger,
    );
    for (const { className, methodName, options, call } of methods) {
      const name = `${className}.${methodName}`;
      this.refuseTakenChannel(options.channel, name);
      this.resequencers.define(
        `${DECORATOR} on ${name}`,
        options,
        (event: ResequencedEvent) => call(event),
        true,
      );
    }
  }

  /** One channel, one consumer: a channel another handler (or resequencer) consumes is refused. */
  private refuseTakenChannel(channel: string, name: string): void {
    const taken =
      this.sequenceHandlers.get(channel)?.name ??
      this.claimChecks.all().find((each) => each.consumer.channel === channel)?.name ??
      this.registry
        .all()
        .find((each) => each.subscribed && each.resequencer.definition.channel === channel)
        ?.definedBy;
    if (taken) throw new SequenceHandlerConflictError(channel, taken, name);
  }
}
