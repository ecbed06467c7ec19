import { SequenceError } from './sequence.error';

/**
 * A savepoint's work ended after an enclosing savepoint's rollback had already ended the
 * savepoint, and what it wrote (typically: an inbox handler call that ran past its time limit,
 * whose writes the claim rolled back). Nothing of it stands; nothing more was sent for it.
 */
export class SavepointEndedError extends SequenceError {
  readonly code = 'savepoint-ended' as const;

  constructor(readonly savepoint: string) {
    super(
      `savepoint ${savepoint} was ended by an enclosing rollback while its work ran: what it ` +
        'wrote was rolled back with it',
    );
  }
}
