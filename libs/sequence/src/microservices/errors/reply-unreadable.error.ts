import { errorMessage } from '../../core/errors/caught';
import { SequenceError } from '../../core/errors/sequence.error';

/**
 * The reply to a `send()` came but its read failed: its payload store failed as it was read, or
 * its bytes are not those its ticket names. `cause` is the read's error. The request was handled.
 * (A reply refused before it is read, its payload already gone say, is dead-lettered: its caller
 * gets `ReplyTimeoutError`.)
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
