import { BrokerUnavailableError } from '../core/errors/broker-unavailable.error';
import { ClaimLedgerTimeoutError } from '../core/errors/claim-ledger-timeout.error';
import { PayloadReadTimeoutError } from '../core/errors/payload-read-timeout.error';
import { PayloadStoreTimeoutError } from '../core/errors/payload-store-timeout.error';
import { ResequencerStoreTimeoutError } from '../core/errors/resequencer-store-timeout.error';
import { SequenceStoreTimeoutError } from '../core/errors/sequence-store-timeout.error';
import {
  isError,
  isNetworkError,
  isPostgresConnectionError,
} from '../core/errors/connection-errors';

/**
 * Error names of the clients the adapters use, for a connection that is gone or not answering:
 * ioredis's command given up after `maxRetriesPerRequest` reconnections, NATS's closed or failed
 * connection and request timeout. Matched by name: these clients are optional peers, not loaded
 * here. Not amqplib's IllegalOperationError: a channel the broker closed for what was asked of it
 * throws it too.
 */
const UNAVAILABLE_NAMES: ReadonlySet<string> = new Set([
  'MaxRetriesPerRequestError',
  'ClosedConnectionError',
  'ConnectionError',
  'TimeoutError',
]);

/**
 * What ioredis and amqplib throw while disconnected: a command on a client that is closed or
 * reconnecting (no offline queue), or that `commandTimeout` gave up on; a call whose connection
 * dropped before its reply, or made on a closed connection.
 */
const UNAVAILABLE_MESSAGE =
  /^(Connection is closed\.|Stream isn't writeable|Command timed out$|Channel ended, no reply will be forthcoming|Connection closed)/;

/** The module's own errors for a store step given up on: the store stopped answering. */
const STORE_TIMEOUTS = [
  SequenceStoreTimeoutError,
  ResequencerStoreTimeoutError,
  PayloadReadTimeoutError,
  PayloadStoreTimeoutError,
  ClaimLedgerTimeoutError,
] as const;

/**
 * Whether `error` (or an error it was caused by) means a store or the broker cannot be reached
 * now, rather than a bug: the request may succeed when tried again later. Told by a transport's
 * BrokerUnavailableError, the module's errors for a store that did not answer in time, the
 * network error code, PostgreSQL's connection errors, or the client's error name or message.
 */
export function isUnavailable(error: unknown): boolean {
  for (let depth = 0; isError(error) && depth < 5; depth++) {
    if (error instanceof BrokerUnavailableError) return true;
    if (STORE_TIMEOUTS.some((type) => error instanceof type)) return true;
    if (isNetworkError(error) || isPostgresConnectionError(error)) return true;
    if (UNAVAILABLE_NAMES.has(error.name) || UNAVAILABLE_MESSAGE.test(error.message)) return true;
    error = error.cause;
  }
  return false;
}
