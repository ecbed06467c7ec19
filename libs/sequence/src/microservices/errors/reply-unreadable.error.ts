import { errorMessage } from '../../core/errors/caught';
import { SequenceError } from '../../core/errors/sequence.error';

/**
 * The reply to a `send()` came but could not be read: its payload store failed or no longer has
 * it, or its bytes are not those its ticket or sequence names. `cause` is the read's error. The
 * request was handled.
 */
export class ReplyUnreadableError extends SequenceError {
  readonly code = 'reply-unreadable' as const;

  constructor(
    readonly pattern: string,
    readonly correlationId: string,
    cause: unknown,
  ) {
    super(
      `the reply to ${pattern} (correlation id ${correlationId}) came but could not be read: ` +
        `${errorMessage(cause)}; the request was handled: make its handler idempotent before ` +
        'sending it again',
      { cause },
    );
  }
}
