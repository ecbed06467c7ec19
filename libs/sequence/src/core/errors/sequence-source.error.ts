import { SequenceError } from './sequence.error';
import { errorMessage } from './caught';

/**
 * The payload's source failed while `send` was reading it (a stream that errored, a chunk that is
 * not bytes). The fragments before it are on the broker: the sequence is incomplete, and the
 * consumer will expire it. Send the whole payload again, under this `sequenceId` to let the
 * consumer's de-duplication fill the gap, or under a new one.
 */
export class SequenceSourceError extends SequenceError {
  readonly code = 'source-failed' as const;

  constructor(
    readonly channel: string,
    readonly sequenceId: string,
    /** Fragments handed to the transport before the source failed (each confirmed or failed). */
    readonly fragmentsSent: number,
    cause: unknown,
  ) {
    super(
      `sequence ${sequenceId} on ${channel}: its source failed after ${fragmentsSent} ` +
        `fragment(s) were sent: ${errorMessage(cause)}`,
      { cause },
    );
  }
}
