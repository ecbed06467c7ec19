/**
 * Headers of the microservices integration, on top of the wire contract. They travel as user
 * headers: on every fragment of a sequence, on a ticket's message, on an inline payload.
 */
export const RpcHeader = {
  /** The Nest pattern the message is for; absent: the channel's name. */
  pattern: 'x-pattern',
  /** Request-reply: the requester's reply channel. */
  replyTo: 'x-reply-to',
  /** Request-reply: pairs a reply with its request. */
  correlationId: 'x-correlation-id',
  /** On a reply: `ok`, or `error` when the body is the handler's error. */
  replyStatus: 'x-reply-status',
} as const;

/** The value of a header as a string, or undefined when it is not one. */
export function headerString(
  headers: Readonly<Record<string, unknown>>,
  name: string,
): string | undefined {
  const value = headers[name];
  if (typeof value === 'string') return value;
  if (Buffer.isBuffer(value)) return value.toString('utf8');
  return undefined;
}
