import { errorMessage } from './caught';
import { SequenceError } from './sequence.error';

/**
 * The database session of an inbox record's claim ended after the record's handler had returned,
 * for the second time in a row (a pooler's or the server's idle timeout shorter than the handler,
 * a failover): what the handler wrote in the claim's transaction was rolled back. The first such
 * end hands the record back uncounted; this one counts an attempt, so that a handler that always
 * outlasts the session ends `FAILED` rather than running again at every poll.
 */
export class InboxSessionEndedError extends SequenceError {
  readonly code = 'inbox-session-ended' as const;

  constructor(
    /** The id of the inbox record. */
    readonly recordId: string,
    cause: unknown,
  ) {
    super(
      `the database session ended after the handler of ${recordId} returned, a second time in a ` +
        'row (an idle timeout of the server or a pooler shorter than the handler, a failover); ' +
        `what it wrote in the claim's transaction was rolled back: ${errorMessage(cause)}`,
      { cause },
    );
  }
}
