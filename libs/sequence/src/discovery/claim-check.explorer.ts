import { Inject, Injectable, Logger, type OnModuleInit } from '@nestjs/common';
import { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { CLAIM_CHECK_OPTIONS } from '../claim-check/claim-check.constants';
import { ClaimCheckReceiver } from '../claim-check/claim-check.receiver';
import type { ClaimCheckConsumer } from '../claim-check/claim-check-consumer';
import {
  claimRetentionProblem,
  type ResolvedClaimCheckOptions,
} from '../claim-check/claim-check.options';
import { SequenceHandlerConflictError } from '../core/errors/sequence-handler-conflict.error';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { SEQUENCE_OPTIONS } from '../sequence.constants';
import { resolveConsumerOptions, type ResolvedSequenceOptions } from '../sequence.options';
import { CLAIM_CHECK_METADATA, type ClaimCheckHandlerOptions } from './claim-check.decorator';
import { ClaimCheckRegistry } from './claim-check.registry';
import { decoratedMethods } from './decorated-methods';
import { missingChannelMessage } from './discovery.messages';
import { SequencedHandlerRegistry } from './sequenced-handler.registry';

const DECORATOR = '@ClaimCheck';

/** Finds `@ClaimCheck` methods on singleton providers and registers them. */
@Injectable()
export class ClaimCheckExplorer implements OnModuleInit {
  private readonly logger = new Logger('SequenceModule');

  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly reflector: Reflector,
    @Inject(CLAIM_CHECK_OPTIONS) private readonly claimCheckOptions: ResolvedClaimCheckOptions,
    @Inject(SEQUENCE_OPTIONS) private readonly sequenceOptions: ResolvedSequenceOptions,
    private readonly registry: ClaimCheckRegistry,
    private readonly sequenceHandlers: SequencedHandlerRegistry,
    private readonly receiver: ClaimCheckReceiver,
  ) {}

  onModuleInit(): void {
    const methods = decoratedMethods<ClaimCheckHandlerOptions>(
      this.discovery,
      this.scanner,
      this.reflector,
      CLAIM_CHECK_METADATA,
      DECORATOR,
      this.logger,
    );
    for (const { className, methodName, options, call } of methods) {
      const name = `${className}.${methodName}`;
      const where = `${DECORATOR} on ${name}`;
      const { channel, deleteAfter, handlerRetry, prefetch, deadLetterChannel, sequence } = options;
      const problems: string[] = [];
      if (typeof channel !== 'string' || channel.length === 0) {
        problems.push(missingChannelMessage(DECORATOR, className, methodName));
      }
      const retentionProblem =
        deleteAfter === undefined ? undefined : claimRetentionProblem(deleteAfter);
      if (retentionProblem) problems.push(`deleteAfter ${retentionProblem}`);
      if (problems.length > 0) throw new SequenceOptionsError(where, problems);
      const sequenceHandler = this.sequenceHandlers.get(channel);
      if (sequenceHandler)
        throw new SequenceHandlerConflictError(channel, sequenceHandler.name, name);

      // Validates the sequence options too (they reach the aggregator unchanged).
      const resolved = resolveConsumerOptions(
        where,
        { ...sequence, handlerRetry, prefetch, deadLetterChannel },
        this.sequenceOptions,
      );
      const consumer: ClaimCheckConsumer = {
        channel,
        handler: (payload) => call(payload),
        deleteAfter: deleteAfter ?? this.claimCheckOptions.deleteAfter,
        handlerRetry: resolved.handlerRetry,
        prefetch: resolved.prefetch,
        deadLetterChannel: resolved.deadLetterChannel,
        sequence,
      };
      this.registry.add({ name, consumer });
      this.receiver.prepare(consumer);
    }
  }
}
