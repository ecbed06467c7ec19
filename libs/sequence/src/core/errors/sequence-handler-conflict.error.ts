import { SequenceError } from './sequence.error';

/** Two `@SequencedHandler` methods claim one channel; the application does not start. */
export class SequenceHandlerConflictError extends SequenceError {
  readonly code = 'handler-conflict' as const;

  constructor(
    readonly channel: string,
    /** `ClassName.methodName` of the handler registered first. */
    readonly first: string,
    readonly second: string,
  ) {
    super(
      `channel ${channel} has two @SequencedHandler methods (${first} and ${second}); ` +
        `one channel is consumed by one handler — give them different channels.`,
    );
  }
}
