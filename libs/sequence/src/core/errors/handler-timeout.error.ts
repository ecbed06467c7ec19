import { SequenceError } from './sequence.error';

/**
 * A handler call ran past its `handlerTimeoutMs`: the call was abandoned (its `AbortSignal`
 * aborted with this error), and the attempt counts as failed under `handlerRetry`. Whatever the
 * abandoned call returns later is ignored.
 */
export class HandlerTimeoutError extends SequenceError {
  readonly code = 'handler-timeout' as const;

  constructor(
    /** The channel whose handler timed out. */
    readonly channel: string,
    /** What it was handling: `sequence s-1`, `ticket fs:ab12`, `key order-7, event 3`... */
    readonly subject: string,
    readonly timeoutMs: number,
    /** Which call for this message it was: 1 for the first. */
    readonly attempt: number,
  ) {
    super(
      `the handler of ${channel} timed out after ${timeoutMs} ms on ${subject} ` +
        `(attempt ${attempt}); it was asked to stop through its AbortSignal`,
    );
  }
}
