import { Inject, Injectable, Logger, type OnModuleInit } from '@nestjs/common';
import { DiscoveryService, MetadataScanner, ModulesContainer, Reflector } from '@nestjs/core';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { HANDLER_KINDS, type ChannelBinding, type HandlerKind } from './channel-binding';
import { ChannelRegistry } from './channel.registry';
import { decoratedMethods, type HandlerInstances } from './decorated-methods';
import { LAZY_SEQUENCE_MODULE_MESSAGE } from './discovery.messages';
import { initFailedEverywhere } from './sequence.lifecycle';

/** A module of the application, as Nest's container holds it. */
export type NestModule = NonNullable<ReturnType<ModulesContainer['get']>>;

/**
 * Finds the methods of singleton providers and controllers that carry a handler decorator, for
 * every kind of handler in one table, binds each (its kind validates its options) and registers
 * the channels they consume. Runs at module init over every module there is: an invalid option
 * or two handlers on one channel fail the application's start. A module loaded lazily later (Nest
 * runs no lifecycle hook in it) is explored when its load is over ({@link exploreLoaded}).
 */
@Injectable()
export class HandlerExplorer implements OnModuleInit {
  private readonly logger = new Logger('SequenceModule');
  /** False until module init, which explores every module there is then. */
  private initialised = false;
  private readonly explored = new WeakSet<NestModule>();
  /** Kept across explorations: a lazy module's provider may be a class another module provides. */
  private readonly instancesOf: HandlerInstances = new Map();

  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly reflector: Reflector,
    private readonly registry: ChannelRegistry,
    private readonly modules: ModulesContainer,
    @Inject(HANDLER_KINDS) private readonly kinds: readonly HandlerKind[],
  ) {}

  async onModuleInit(): Promise<void> {
    const modules = [...this.modules.values()];
    try {
      this.explore(modules, (binding) => this.registry.add(binding));
    } catch (error) {
      await initFailedEverywhere(modules);
      throw error;
    }
    for (const module of modules) this.explored.add(module);
    this.initialised = true;
  }

  /**
   * Binds the handlers of those of `modules` not explored yet (a module a lazy load built, and
   * the modules it imports) and hands their channels to `open`; the modules count as explored
   * once `open` resolves, so that loading the module again, after a failure, tries again. Before
   * module init it does nothing: init explores every module there is then.
   * @throws SequenceOptionsError for a handler's invalid options, or for a new module that is
   * an instance of SequenceModule (Nest would run none of its hooks); what `open` throws
   */
  async exploreLoaded(
    modules: readonly NestModule[],
    open: (bindings: ChannelBinding[]) => Promise<void>,
  ): Promise<void> {
    if (!this.initialised) return;
    const fresh = modules.filter((module) => !this.explored.has(module));
    if (fresh.length === 0) return;
    if (fresh.some((module) => module.providers.has(HandlerExplorer))) {
      throw new SequenceOptionsError('SequenceModule', [LAZY_SEQUENCE_MODULE_MESSAGE]);
    }
    const bindings: ChannelBinding[] = [];
    this.explore(fresh, (binding) => bindings.push(binding));
    await open(bindings);
    for (const module of fresh) this.explored.add(module);
  }

  /**
   * The handlers (`Class.method`) of those of `modules` not explored yet, found without binding
   * any: for a module whose handlers are refused (loaded once the shutdown began).
   */
  handlersIn(modules: readonly NestModule[]): string[] {
    const wrappers = this.wrappersOf(modules.filter((module) => !this.explored.has(module)));
    return this.kinds.flatMap((kind) =>
      decoratedMethods(
        wrappers,
        this.scanner,
        this.reflector,
        kind.metadataKey,
        kind.decorator,
        this.logger,
      ).map(({ className, methodName }) => `${className}.${methodName}`),
    );
  }

  private wrappersOf(modules: NestModule[]) {
    return [
      ...this.discovery.getProviders({}, modules),
      ...this.discovery.getControllers({}, modules),
    ];
  }

  private explore(modules: NestModule[], add: (binding: ChannelBinding) => void): void {
    const wrappers = this.wrappersOf(modules);
    for (const kind of this.kinds) {
      const methods = decoratedMethods(
        wrappers,
        this.scanner,
        this.reflector,
        kind.metadataKey,
        kind.decorator,
        this.logger,
        this.instancesOf,
      );
      for (const method of methods) {
        for (const binding of kind.bind(method)) add(binding);
      }
    }
  }
}
