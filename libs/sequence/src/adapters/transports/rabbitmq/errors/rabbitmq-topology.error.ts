import { SequenceError } from '../../../../core/errors/sequence.error';

/**
 * The broker refused to declare a channel's queue: usually it already exists with other
 * arguments (another `x-queue-type`, or no dead-letter settings), or access was denied. Also a
 * queue name the transport refuses before sending anything (`replyCode` 0): longer than AMQP's
 * 255 bytes, or of the reply queues' `nseq.reply.` prefix without being one.
 */
export class RabbitMqTopologyError extends SequenceError {
  readonly code = 'topology-refused' as const;

  constructor(
    /** The queue whose declaration failed. */
    readonly queue: string,
    /** The AMQP reply code (406 PRECONDITION_FAILED, 403 ACCESS_REFUSED, ...); 0: not sent. */
    readonly replyCode: number,
    cause: Error,
  ) {
    super(
      replyCode === 0
        ? `queue ${queue.slice(0, 80)}${queue.length > 80 ? '…' : ''} cannot be used: ` +
            `${cause.message}; nothing was sent`
        : `RabbitMQ refused to declare queue ${queue} (${replyCode}): ${cause.message}. ` +
            `If it exists with other arguments (queue type, dead-letter settings), delete it or ` +
            `use the same queueType it was declared with`,
      { cause },
    );
  }
}
