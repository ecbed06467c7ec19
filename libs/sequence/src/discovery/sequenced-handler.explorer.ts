import { Injectable, Logger, type OnModuleInit } from '@nestjs/common';
import { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { AggregatorService } from '../sequence/aggregator.service';
import type { ReassembledPayload } from '../sequence/reassembled-payload';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { missingChannelMessage, requestScopedHandlerMessage } from './discovery.messages';
import {
  SEQUENCED_HANDLER_METADATA,
  type SequencedHandlerOptions,
} from './sequenced-handler.decorator';
import { SequencedHandlerRegistry } from './sequenced-handler.registry';

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
    for (const wrapper of this.discovery.getProviders()) {
      const instance: unknown = wrapper.instance;
      if (!instance || typeof instance !== 'object') continue;
      const prototype = Object.getPrototypeOf(instance) as object | null;
      if (!prototype) continue;
      for (const methodName of this.scanner.getAllMethodNames(prototype)) {
        const method = (instance as Record<string, unknown>)[methodName];
        if (typeof method !== 'function') continue;
        const options = this.reflector.get<SequencedHandlerOptions | undefined>(
          SEQUENCED_HANDLER_METADATA,
          method,
        );
        if (!options) continue;
        const className = (instance.constructor as { name: string }).name;
        if (!wrapper.isDependencyTreeStatic()) {
          this.logger.warn(requestScopedHandlerMessage(className, methodName));
          continue;
        }
        if (typeof options.channel !== 'string' || options.channel.length === 0) {
          throw new SequenceOptionsError(`@SequencedHandler on ${className}.${methodName}`, [
            missingChannelMessage(className, methodName),
          ]);
        }
        const { channel, ...overrides } = options;
        const handler = (payload: ReassembledPayload): unknown =>
          (method as (p: ReassembledPayload) => unknown).call(instance, payload);
        this.registry.add({
          name: `${className}.${methodName}`,
          consumer: this.aggregator.createConsumer(channel, handler, overrides),
        });
      }
    }
  }
}
