import { SequenceOptionsError } from '../core/errors/sequence-options.error';

export const requestScopedHandlerMessage = (
  decorator: string,
  className: string,
  methodName: string,
): string =>
  `${decorator} on ${className}.${methodName} is ignored: ${className} is request-scoped ` +
  `(or depends on a request-scoped provider). Message handlers run outside any request; ` +
  `move the method to a singleton provider.`;

export const transientHandlerMessage = (
  decorator: string,
  className: string,
  methodName: string,
): string =>
  `${decorator} on ${className}.${methodName} is ignored: ${className} is transient, so each ` +
  `injection gets an instance of its own and there is no one instance to deliver messages to; ` +
  `make it a singleton provider.`;

export const staticHandlerMessage = (
  decorator: string,
  className: string,
  methodName: string,
): string =>
  `${decorator} on ${className}.${methodName} is on a static method, which no instance of ` +
  `${className} holds; make it an instance method`;

export const duplicateInstanceMessage = (
  decorator: string,
  className: string,
  methodName: string,
  firstModule: string,
  secondModule: string,
): string =>
  `${decorator} on ${className}.${methodName}: ${className} is ` +
  (firstModule === secondModule
    ? `provided twice in ${firstModule}`
    : `a provider of ${firstModule} and of ${secondModule}`) +
  `, so each instance would consume its channels; provide it in one module (and export it to ` +
  `the others)`;

export const LAZY_SEQUENCE_MODULE_MESSAGE =
  'SequenceModule is imported by a module loaded lazily: Nest runs no lifecycle hook there, so ' +
  'that instance would never start; import SequenceModule once, in the root module (with ' +
  'isGlobal: true for other modules to inject its services)';

export const missingChannelMessage = (
  decorator: string,
  className: string,
  methodName: string,
): string => `${decorator} on ${className}.${methodName} needs a non-empty channel.`;

/** The channel a decorator names, or a boot error saying it needs one. */
export function requireChannel(
  decorator: string,
  className: string,
  methodName: string,
  channel: unknown,
): string {
  if (typeof channel !== 'string' || channel.length === 0) {
    throw new SequenceOptionsError(`${decorator} on ${className}.${methodName}`, [
      missingChannelMessage(decorator, className, methodName),
    ]);
  }
  return channel;
}
