import { errorMessage } from './caught';
import { SequenceError } from './sequence.error';

/**
 * The database refused to commit an outbox or inbox claim after its batch was handled: a check
 * it makes only at COMMIT failed (a deferred constraint or constraint trigger that what the
 * handlers wrote breaks, a serialization failure). Nothing of the claim was written: its records
 * are as they were. The inbox then handles the batch's records one per claim, and counts this as
 * a failed attempt of the record whose claim, alone, is refused.
 */
export class ClaimCommitRefusedError extends SequenceError {
  readonly code = 'claim-commit-refused' as const;

  constructor(
    /** The database's error. */
    cause: unknown,
  ) {
    super(
      `the database refused to commit the claim (a check made at COMMIT: a deferred constraint ` +
        `or trigger, a serialization failure): ${errorMessage(cause)}`,
      { cause },
    );
  }
}
