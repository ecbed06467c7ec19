import { SequenceError } from './sequence.error';

/** Why a transport cannot reach its broker now. */
export type BrokerUnavailableReason =
  /** The connection was lost and is being made again. */
  | 'reconnecting'
  /** Connected, but the broker holds every publish until a resource alarm (memory, disk) clears. */
  | 'blocked'
  /** The broker did not answer a health check in time. */
  | 'not-answering';

/**
 * The broker cannot be reached now, while the transport is open: the same call may succeed once
 * it is back. Thrown by a transport's `ping()` and by calls that need a live connection (the
 * RabbitMQ dead-letter box); the console answers 503 `unavailable` for it.
 */
export class BrokerUnavailableError extends SequenceError {
  readonly code = 'broker-unavailable' as const;

  constructor(
    /** The transport's name (`rabbitmq`, `nats`). */
    readonly transport: string,
    readonly reason: BrokerUnavailableReason,
    message: string,
  ) {
    super(message);
  }
}
