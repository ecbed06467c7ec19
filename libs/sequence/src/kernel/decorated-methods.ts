import type { Logger } from '@nestjs/common';
import type { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { requestScopedHandlerMessage, transientHandlerMessage } from './discovery.messages';

/** A method of a singleton provider or controller that carries a decorator's options. */
export interface DecoratedMethod<Options> {
  readonly className: string;
  readonly methodName: string;
  readonly options: Options;
  /** Calls the method on its instance. */
  readonly call: (...args: unknown[]) => unknown;
}

/**
 * Every provider and controller method carrying `metadataKey`, once per instance. Request-scoped
 * and transient classes cannot hold a long-lived consumer (there is no one instance to call):
 * they are skipped with a warning. An alias (`useExisting`) is the instance it points to, found
 * under its own token already.
 */
export function decoratedMethods<Options>(
  discovery: DiscoveryService,
  scanner: MetadataScanner,
  reflector: Reflector,
  metadataKey: string,
  /** The decorator's name, for messages, e.g. `@ClaimCheck`. */
  decorator: string,
  logger: Logger,
): Array<DecoratedMethod<Options>> {
  const found: Array<DecoratedMethod<Options>> = [];
  for (const wrapper of [...discovery.getProviders(), ...discovery.getControllers()]) {
    if (wrapper.isAlias) continue;
    const instance: unknown = wrapper.instance;
    if (!instance || typeof instance !== 'object') continue;
    const prototype = Object.getPrototypeOf(instance) as object | null;
    if (!prototype) continue;
    for (const methodName of scanner.getAllMethodNames(prototype)) {
      const method = (instance as Record<string, unknown>)[methodName];
      if (typeof method !== 'function') continue;
      const options = reflector.get<Options | undefined>(metadataKey, method);
      if (!options) continue;
      const className = (instance.constructor as { name: string }).name;
      if (!wrapper.isDependencyTreeStatic()) {
        logger.warn(requestScopedHandlerMessage(decorator, className, methodName));
        continue;
      }
      if (wrapper.isTransient) {
        // Nest constructs a transient class once per injection; the instance discovery sees was
        // never constructed.
        logger.warn(transientHandlerMessage(decorator, className, methodName));
        continue;
      }
      const call = (...args: unknown[]): unknown =>
        (method as (...args: unknown[]) => unknown).apply(instance, args);
      found.push({ className, methodName, options, call });
    }
  }
  return found;
}
