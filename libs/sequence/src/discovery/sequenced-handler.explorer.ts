import { Injectable, Logger, type OnModuleInit } from '@nestjs/common';
import { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { SequenceMetrics } from '../observability/sequence.metrics';
import { ResequencerService } from '../resequencer/resequencer.service';
import { AggregatorService } from '../sequence/aggregator.service';
import { FragmentStream } from '../sequence/fragment-stream';
import type { StreamedFragment } from '../sequence/streamed-fragment';
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
    private readonly resequencers: ResequencerService,
    private readonly metrics: SequenceMetrics,
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
      const { channel, mode, ...overrides } = options;
      const name = `${className}.${methodName}`;
      if (mode !== undefined && mode !== 'reassemble' && mode !== 'stream') {
        throw new SequenceOptionsError(`${DECORATOR} on ${name}`, [
          `mode must be 'reassemble' or 'stream', got ${String(mode)}`,
        ]);
      }
      const handler = (payload: ReassembledPayload): unknown => call(payload);
      const consumer = this.aggregator.createConsumer(channel, handler, overrides);
      const stream =
        mode === 'stream'
          ? new FragmentStream(
              channel,
              consumer.options,
              (fragment: StreamedFragment) => call(fragment),
              this.metrics,
              this.resequencers,
              `${DECORATOR} on ${name}`,
            )
          : undefined;
      this.registry.add({ name, consumer, stream });
    }
  }
}
