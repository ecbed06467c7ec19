import { SequenceError } from '../../../../core/errors/sequence.error';

/**
 * The broker refused to declare a channel's queue: usually it already exists with other
 * arguments (another `x-queue-type`, or no dead-letter settings), or access was denied.
 */
export class RabbitMqTopologyError extends SequenceError {
  readonly code = 'topology-refused' as const;

  constructor(
    /** The queue whose declaration failed. */
    readonly queue: string,
    /** The AMQP reply code (406 PRECONDITION_FAILED, 403 ACCESS_REFUSED, ...). */
    readonly replyCode: number,
    cause: Error,
  ) {
    super(
      `RabbitMQ refused to declare queue ${queue} (${replyCode}): ${cause.message}. ` +
        `If it exists with other arguments (queue type, dead-letter settings), delete it or ` +
        `use the same queueType it was declared with`,
      { cause },
    );
  }
}
