import { SequenceError } from '../../../../core/errors/sequence.error';

/**
 * JetStream refused to declare a channel's stream or consumer, or the channel cannot be a NATS
 * subject: another stream already takes its subject, the account is out of JetStream resources,
 * or the name holds what subjects may not. A publish it fails sent nothing, and is final for the
 * publish's retries (`finalRefusal`, see `isFinalRefusal`): each would be refused the same way.
 * Only a declaration that found no cluster leader in time is not final.
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
    /** Whether a retry cannot change it: false for a cluster that had no leader in time. */
    readonly finalRefusal = true,
  ) {
    super(
      `NATS JetStream could not declare stream ${stream} for channel ${channel}: ${problem}`,
      cause ? { cause } : undefined,
    );
  }
}
