export const requestScopedHandlerMessage = (className: string, methodName: string): string =>
  `@SequencedHandler on ${className}.${methodName} is ignored: ${className} is request-scoped ` +
  `(or depends on a request-scoped provider). Sequence handlers run outside any request; ` +
  `move the method to a singleton provider.`;

export const missingChannelMessage = (className: string, methodName: string): string =>
  `@SequencedHandler on ${className}.${methodName} needs a non-empty channel.`;
