import { SequenceError } from './sequence.error';

/**
 * Two handler methods (`@SequencedHandler`, `@ClaimCheck`, `@Resequenced`, `@InboxHandler`, in
 * any combination; inbox handlers of different types may share one) claim one channel; the
 * application does not start.
 */
export class SequenceHandlerConflictError extends SequenceError {
  readonly code = 'handler-conflict' as const;

  constructor(
    readonly channel: string,
    /** `ClassName.methodName` of the handler registered first. */
    readonly first: string,
    readonly second: string,
  ) {
    super(
      `channel ${channel} has two handler methods (${first} and ${second}); ` +
        `one channel is consumed by one handler — give them different channels.`,
    );
  }
}
