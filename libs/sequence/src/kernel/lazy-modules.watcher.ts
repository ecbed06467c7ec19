import { Injectable, Logger } from '@nestjs/common';
import { LazyModuleLoader, ModuleRef, ModulesContainer } from '@nestjs/core';
import { HandlerExplorer, type NestModule } from './handler.explorer';
import { SequenceLifecycle } from './sequence.lifecycle';

/**
 * Has the handlers of a module that `LazyModuleLoader.load` adds to the application consume their
 * channels, as those of the modules loaded at startup do. Nest runs no lifecycle hook in a lazily
 * loaded module and tells nobody of the load, so this wraps the `load` of the application's one
 * `LazyModuleLoader`: a load resolves once the new modules' handlers are subscribed (or
 * registered, when the module has not started yet), and rejects, as the bootstrap would fail,
 * on a handler's invalid options or on a channel another handler consumes already. A load once
 * the module's shutdown began resolves too, but subscribes none of the new modules' handlers (no
 * handler consumes from then on): a warning names the module.
 */
@Injectable()
export class LazyModulesWatcher {
  private readonly logger = new Logger('SequenceModule');
  /**
   * One exploration at a time: two loads that build the same import explore it once, and a
   * second handler of a channel is refused whichever load comes first.
   */
  private explorations: Promise<unknown> = Promise.resolve();

  constructor(
    loader: LazyModuleLoader,
    private readonly modules: ModulesContainer,
    private readonly explorer: HandlerExplorer,
    private readonly lifecycle: SequenceLifecycle,
  ) {
    // At construction: a provider's onModuleInit may load a module before this module's init.
    const load = loader.load.bind(loader);
    loader.load = async (loaderFn, loadOptions) => {
      const moduleRef = await load(loaderFn, loadOptions);
      await this.explore(moduleRef);
      return moduleRef;
    };
  }

  private explore(moduleRef: ModuleRef): Promise<void> {
    const explored = this.explorations.then(async () => {
      const modules = this.builtBy(moduleRef);
      // Not explored: binding a handler would register it with its pattern.
      if (this.lifecycle.shuttingDown) {
        return this.refuse(modules, this.explorer.handlersIn(modules));
      }
      await this.explorer.exploreLoaded(modules, async (bindings) => {
        if (!(await this.lifecycle.addBindings(bindings))) {
          this.refuse(
            modules,
            bindings.map((binding) => binding.definedBy),
          );
        }
      });
    });
    this.explorations = explored.catch(() => undefined);
    return explored;
  }

  /** Warns that the handlers of a module loaded once the shutdown began consume nothing. */
  private refuse(modules: readonly NestModule[], handlers: readonly string[]): void {
    if (handlers.length === 0) return;
    this.logger.warn(
      `${modules[0]?.name ?? 'a module'} was loaded after SequenceModule's shutdown began: its ` +
        `handlers are not subscribed (${handlers.join(', ')}); no handler consumes once the ` +
        'shutdown began',
    );
  }

  /**
   * The module `moduleRef` belongs to and every module it imports, the modules a load adds to the
   * container. Not every module the container holds: a concurrent load's may not be built yet.
   */
  private builtBy(moduleRef: ModuleRef): NestModule[] {
    const target = [...this.modules.values()].find(
      (module) => module.getProviderByKey(ModuleRef)?.instance === moduleRef,
    );
    const found = new Set<NestModule>(target ? [target] : []);
    // A Set iterates over what is added to it during the iteration.
    for (const module of found) for (const imported of module.imports) found.add(imported);
    return [...found];
  }
}
