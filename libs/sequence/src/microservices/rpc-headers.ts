import { headerText, type HeaderMap } from '../core/headers';

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
  return headerText(headers[name]);
}

/**
 * The sender's `headers`, with the headers above that the transport's message carries as bytes
 * added as text: AMQP clients of other languages may send a header as a byte array (a Java
 * `byte[]`, Python `bytes`), which amqplib hands over as a Buffer, and a payload's headers keep
 * strings, numbers and booleans only. Without it such a message would lose its pattern.
 */
export function withRpcHeaders(
  headers: Readonly<HeaderMap>,
  transportHeaders: Readonly<Record<string, unknown>> | undefined,
): Readonly<HeaderMap> {
  let merged: HeaderMap | undefined;
  for (const name of Object.values(RpcHeader)) {
    const value = transportHeaders?.[name];
    if (headers[name] !== undefined || !Buffer.isBuffer(value)) continue;
    merged ??= { ...headers };
    merged[name] = value.toString('utf8');
  }
  return merged ?? headers;
}
