import { SequenceError } from './sequence.error';

/**
 * The application's shutdown waited `shutdownTimeoutMs` for a handler call that had not returned
 * (an `@InboxHandler`'s, counted from when its processor began to stop, once the subscriptions
 * closed): the call was abandoned (its `AbortSignal` aborted with this error), and its message is
 * handled again later, here after a restart or on another instance, without counting a failed
 * attempt. Whatever the abandoned call returns later is ignored.
 */
export class ShutdownTimeoutError extends SequenceError {
  readonly code = 'shutdown-timeout' as const;

  constructor(
    /** The channel whose handler was still running. */
    readonly channel: string,
    /** What it was handling: `event order.created r-1`... */
    readonly subject: string,
    readonly timeoutMs: number,
  ) {
    super(
      `the handler of ${channel} was still running on ${subject} ${timeoutMs} ms after its ` +
        'processor began to stop for the shutdown (shutdownTimeoutMs); it was asked to stop ' +
        'through its AbortSignal, and its message is handled again later',
    );
  }
}
