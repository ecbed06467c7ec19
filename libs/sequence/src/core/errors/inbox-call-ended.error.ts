import { SequenceError } from './sequence.error';

/**
 * A statement, savepoint, message or access to `client` on an inbox handler's transaction (or on
 * an `OutboxService.transaction` joined inside the handler) after the handler's call had ended:
 * work it left running, such as a call it did not await. The claim's transaction has moved on to
 * other records, where it would have landed, so it is refused and nothing of it is written. After
 * a call that failed, so is an `OutboxService.transaction()` such work starts: it would commit
 * beside the retry, which writes the same again.
 */
export class InboxCallEndedError extends SequenceError {
  readonly code = 'inbox-call-ended' as const;

  constructor(
    /** The id of the inbox record whose handler call had ended. */
    readonly recordId: string,
    /** How the call ended: `failed` (its writes were rolled back) or `completed`. */
    readonly ended: 'failed' | 'completed',
  ) {
    super(
      `the inbox handler's call for ${recordId} had ${
        ended === 'failed'
          ? 'failed, and its writes were rolled back: a statement or message of its ' +
            'transaction, or a transaction() it starts, after that is refused'
          : 'returned: a statement or message of its transaction after that is refused'
      }; await everything the handler starts before it returns or throws`,
    );
  }
}
