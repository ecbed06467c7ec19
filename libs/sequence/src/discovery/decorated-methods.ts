import type { Logger } from '@nestjs/common';
import type { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { requestScopedHandlerMessage } from './discovery.messages';

/** A method of a singleton provider that carries a decorator's options. */
export interface DecoratedMethod<Options> {
  readonly className: string;
  readonly methodName: string;
  readonly options: Options;
  /** Calls the method on its instance. */
  readonly call: (...args: unknown[]) => unknown;
}

/**
 * Every provider method carrying `metadataKey`. Request-scoped providers cannot hold a
 * long-lived consumer: they are skipped with a warning.
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
  for (const wrapper of discovery.getProviders()) {
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
      const call = (...args: unknown[]): unknown =>
        (method as (...args: unknown[]) => unknown).apply(instance, args);
      found.push({ className, methodName, options, call });
    }
  }
  return found;
}
