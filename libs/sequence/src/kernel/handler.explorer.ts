import { Inject, Injectable, Logger, type OnModuleInit } from '@nestjs/common';
import { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { HANDLER_KINDS, type HandlerKind } from './channel-binding';
import { ChannelRegistry } from './channel.registry';
import { decoratedMethods } from './decorated-methods';

/**
 * Finds the methods of singleton providers and controllers that carry a handler decorator, for
 * every kind of handler in one table, binds each (its kind validates its options) and registers
 * the channels they consume. Runs once, at module init: an invalid option or two handlers on one
 * channel fail the application's start.
 */
@Injectable()
export class HandlerExplorer implements OnModuleInit {
  private readonly logger = new Logger('SequenceModule');

  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly reflector: Reflector,
    private readonly registry: ChannelRegistry,
    @Inject(HANDLER_KINDS) private readonly kinds: readonly HandlerKind[],
  ) {}

  onModuleInit(): void {
    for (const kind of this.kinds) {
      const methods = decoratedMethods(
        this.discovery,
        this.scanner,
        this.reflector,
        kind.metadataKey,
        kind.decorator,
        this.logger,
      );
      for (const method of methods) {
        for (const binding of kind.bind(method)) this.registry.add(binding);
      }
    }
  }
}
