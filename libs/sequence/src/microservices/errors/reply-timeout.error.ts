import { SequenceError } from '../../core/errors/sequence.error';

/** `send()` got no reply within `replyTimeoutMs`: the request may still be handled. */
export class ReplyTimeoutError extends SequenceError {
  readonly code = 'reply-timeout' as const;

  constructor(
    readonly pattern: string,
    readonly correlationId: string,
    readonly timeoutMs: number,
  ) {
    super(
      `no reply to ${pattern} (correlation id ${correlationId}) within ${timeoutMs} ms; the ` +
        'request may still be handled: make its handler idempotent before sending it again',
    );
  }
}
