import { SequenceError } from '../../../../core/errors/sequence.error';

/**
 * JetStream refused to declare a channel's stream or consumer, or the channel cannot be a NATS
 * subject: another stream already takes its subject, the account is out of JetStream resources,
 * or the name holds what subjects may not.
 */
export class NatsTopologyError extends SequenceError {
  readonly code = 'topology-refused' as const;

  constructor(
    /** The channel whose stream or consumer could not be declared. */
    readonly channel: string,
    /** The stream it maps to (see the transport's naming). */
    readonly stream: string,
    problem: string,
    cause?: Error,
  ) {
    super(
      `NATS JetStream could not declare stream ${stream} for channel ${channel}: ${problem}`,
      cause ? { cause } : undefined,
    );
  }
}
