import { SequenceError } from './sequence.error';

/**
 * The broker answered a publish with a negative confirm (`basic.nack`): it did not take the
 * message, for instance because the queue is at its `max-length` with `overflow: reject-publish`,
 * or after an internal error. Publishing again later may succeed. Also what a publish that may
 * not be sent again (`resend: false`) fails with when the broker returns it as unroutable.
 */
export class PublishRejectedError extends SequenceError {
  readonly code = 'publish-rejected' as const;

  constructor(
    readonly channel: string,
    cause: Error,
    how = 'negative confirm',
  ) {
    super(
      `the broker refused a message to ${channel} (${how}); check the queue's ` +
        `length limits and the broker's logs, then publish again`,
      { cause },
    );
  }
}
