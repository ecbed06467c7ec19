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
  const wrappers = [...discovery.getProviders(), ...discovery.getControllers()];
  for (const { wrapper, instance, className, methodName, method } of instanceMethods(
    wrappers,
    scanner,
  )) {
    const options = reflector.get<Options | undefined>(metadataKey, method);
    if (!options) continue;
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
    const call = (...args: unknown[]): unknown => method.apply(instance, args);
    found.push({ className, methodName, options, call });
  }
  return found;
}

type InstanceWrapper = ReturnType<DiscoveryService['getProviders']>[number];

/** One method of an instance Nest made, as discovery finds it. */
export interface InstanceMethod {
  readonly wrapper: InstanceWrapper;
  readonly instance: object;
  readonly className: string;
  readonly methodName: string;
  readonly method: (...args: unknown[]) => unknown;
}

/**
 * Every method (inherited ones included) of the instances `wrappers` hold, once per instance: an
 * alias (`useExisting`) is the instance it points to, found under its own token already.
 */
export function* instanceMethods(
  wrappers: readonly InstanceWrapper[],
  scanner: MetadataScanner,
): Generator<InstanceMethod> {
  for (const wrapper of wrappers) {
    if (wrapper.isAlias) continue;
    const instance: unknown = wrapper.instance;
    if (!instance || typeof instance !== 'object') continue;
    const prototype = Object.getPrototypeOf(instance) as object | null;
    if (!prototype) continue;
    const className = (instance.constructor as { name: string }).name;
    for (const methodName of scanner.getAllMethodNames(prototype)) {
      const method = (instance as Record<string, unknown>)[methodName];
      if (typeof method !== 'function') continue;
      yield {
        wrapper,
        instance,
        className,
        methodName,
        method: method as (...args: unknown[]) => unknown,
      };
    }
  }
}
