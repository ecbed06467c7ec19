import { isConnectionError, isError } from '../core/errors/connection-errors';

/**
 * Error names of the clients the adapters use, for a connection that is gone or not answering:
 * ioredis's command given up after `maxRetriesPerRequest` reconnections, amqplib's operation on a
 * closed connection or channel, NATS's closed or failed connection and request timeout. Matched
 * by name: these clients are optional peers, not loaded here.
 */
const UNAVAILABLE_NAMES: ReadonlySet<string> = new Set([
  'MaxRetriesPerRequestError',
  'IllegalOperationError',
  'ClosedConnectionError',
  'ConnectionError',
  'TimeoutError',
]);

/**
 * What ioredis and the RabbitMQ transport throw as plain `Error`s while disconnected: a command
 * on a client that is closed or reconnecting (no offline queue), or that `commandTimeout` gave up
 * on; a dead-letter read while the transport reconnects.
 */
const UNAVAILABLE_MESSAGE =
  /^(Connection is closed\.|Stream isn't writeable|Command timed out$|not connected to RabbitMQ)/;

/**
 * Whether `error` (or an error it was caused by) means a store or the broker cannot be reached
 * now, rather than a bug: the request may succeed when tried again later. PostgreSQL and socket
 * errors are told by `isConnectionError`, the rest by the client's error name or message.
 */
export function isUnavailable(error: unknown): boolean {
  for (let depth = 0; isError(error) && depth < 5; depth++) {
    if (isConnectionError(error)) return true;
    if (UNAVAILABLE_NAMES.has(error.name) || UNAVAILABLE_MESSAGE.test(error.message)) return true;
    error = error.cause;
  }
  return false;
}
