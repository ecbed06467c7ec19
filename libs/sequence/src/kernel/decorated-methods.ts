import type { Logger } from '@nestjs/common';
import type { DiscoveryService, MetadataScanner, Reflector } from '@nestjs/core';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import {
  duplicateInstanceMessage,
  requestScopedHandlerMessage,
  staticHandlerMessage,
  transientHandlerMessage,
} from './discovery.messages';

/** A method of a singleton provider or controller that carries a decorator's options. */
export interface DecoratedMethod<Options> {
  readonly className: string;
  readonly methodName: string;
  readonly options: Options;
  /** Calls the method on its instance. */
  readonly call: (...args: unknown[]) => unknown;
}

/**
 * The class of each instance found with a handler, and its module: a second instance of one class
 * (a provider listed in two modules) would consume the same channels again.
 */
export type HandlerInstances = Map<unknown, { instance: object; module: string }>;

/**
 * Every method carrying `metadataKey` of the providers and controllers `wrappers` hold, once per
 * instance. Request-scoped and transient classes cannot hold a long-lived consumer (there is no
 * one instance to call): they are skipped with a warning. An alias (`useExisting`) is the
 * instance it points to, found under its own token already.
 * @throws SequenceOptionsError for a decorator on a static method of a provider's class (no
 * instance holds it, so it would never be called), or on a class of which there are two
 * instances (a provider of two modules: both would consume its channels), counting those in
 * `instancesOf`, which it adds to.
 */
export function decoratedMethods<Options>(
  wrappers: readonly InstanceWrapper[],
  scanner: MetadataScanner,
  reflector: Reflector,
  metadataKey: string,
  /** The decorator's name, for messages, e.g. `@ClaimCheck`. */
  decorator: string,
  logger: Logger,
  instancesOf: HandlerInstances = new Map(),
): Array<DecoratedMethod<Options>> {
  const found: Array<DecoratedMethod<Options>> = [];
  refuseStaticHandlers(wrappers, reflector, metadataKey, decorator);
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
    const module = wrapper.host?.name ?? 'an unknown module';
    const first = instancesOf.get(instance.constructor);
    if (first && first.instance !== instance) {
      throw new SequenceOptionsError(`${decorator} on ${className}.${methodName}`, [
        duplicateInstanceMessage(decorator, className, methodName, first.module, module),
      ]);
    }
    instancesOf.set(instance.constructor, { instance, module });
    const call = (...args: unknown[]): unknown => method.apply(instance, args);
    found.push({ className, methodName, options, call });
  }
  return found;
}

type InstanceWrapper = ReturnType<DiscoveryService['getProviders']>[number];

/** Properties every function has, never a method of the class. */
const FUNCTION_OWN = new Set(['length', 'name', 'prototype', 'caller', 'arguments']);

/**
 * Throws for the first static method (inherited ones included) of the providers' and
 * controllers' classes that carries `metadataKey`: discovery calls methods on instances, so such
 * a handler would never run, and nothing would say so.
 */
function refuseStaticHandlers(
  wrappers: readonly InstanceWrapper[],
  reflector: Reflector,
  metadataKey: string,
  decorator: string,
): void {
  const seen = new Set<unknown>();
  for (const wrapper of wrappers) {
    const instance: unknown = wrapper.instance;
    if (wrapper.isAlias || !instance || typeof instance !== 'object') continue;
    // An object without a prototype (Object.create(null)) has no class.
    const constructor = (instance as { constructor?: unknown }).constructor;
    if (typeof constructor !== 'function') continue;
    const className = constructor.name;
    let type: unknown = constructor;
    while (
      typeof type === 'function' &&
      type !== Object &&
      type !== Function.prototype &&
      !seen.has(type)
    ) {
      seen.add(type);
      for (const name of Object.getOwnPropertyNames(type)) {
        if (FUNCTION_OWN.has(name)) continue;
        const value: unknown = Object.getOwnPropertyDescriptor(type, name)?.value;
        if (typeof value !== 'function' || reflector.get(metadataKey, value) === undefined) {
          continue;
        }
        throw new SequenceOptionsError(`${decorator} on ${className}.${name}`, [
          staticHandlerMessage(decorator, className, name),
        ]);
      }
      type = Object.getPrototypeOf(type);
    }
  }
}

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
