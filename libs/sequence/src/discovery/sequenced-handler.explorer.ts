import { Injectable, Logger, type OnModuleInit } from '@nestjs/common';
import { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { AggregatorService } from '../sequence/aggregator.service';
import type { ReassembledPayload } from '../sequence/reassembled-payload';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { decoratedMethods } from './decorated-methods';
import { missingChannelMessage } from './discovery.messages';
import {
  SEQUENCED_HANDLER_METADATA,
  type SequencedHandlerOptions,
} from './sequenced-handler.decorator';
import { SequencedHandlerRegistry } from './sequenced-handler.registry';

const DECORATOR = '@SequencedHandler';

/** Finds `@SequencedHandler` methods on singleton providers and registers them. */
@Injectable()
export class SequencedHandlerExplorer implements OnModuleInit {
  private readonly logger = new Logger('SequenceModule');

  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly reflector: Reflector,
    private readonly aggregator: AggregatorService,
    private readonly registry: SequencedHandlerRegistry,
  ) {}

  onModuleInit(): void {
    const methods = decoratedMethods<SequencedHandlerOptions>(
      this.discovery,
      this.scanner,
      this.reflector,
      SEQUENCED_HANDLER_METADATA,
      DECORATOR,
      this.logger,
    );
    for (const { className, methodName, options, call } of methods) {
      if (typeof options.channel !== 'string' || options.channel.length === 0) {
        throw new SequenceOptionsError(`${DECORATOR} on ${className}.${methodName}`, [
          missingChannelMessage(DECORATOR, className, methodName),
        ]);
      }
      const { channel, ...overrides } = options;
      const handler = (payload: ReassembledPayload): unknown => call(payload);
      this.registry.add({
        name: `${className}.${methodName}`,
        consumer: this.aggregator.createConsumer(channel, handler, overrides),
      });
    }
  }
}
