import { SequenceError } from './sequence.error';
import { errorMessage } from './caught';

/**
 * A fragment could not be published (no broker confirm) within the retry budget. The sequence
 * is incomplete on the broker: the consumer will expire it. Send it again under a new id, or
 * under the same id to let the consumer's de-duplication fill the gap.
 */
export class SequencePublishError extends SequenceError {
  readonly code = 'publish-failed' as const;

  constructor(
    readonly channel: string,
    readonly sequenceId: string,
    /** 1-based position of the fragment that failed. */
    readonly position: number,
    readonly attempts: number,
    cause: unknown,
  ) {
    super(
      `sequence ${sequenceId} on ${channel}: fragment ${position} was not confirmed after ` +
        `${attempts} attempt(s): ${errorMessage(cause)}`,
      { cause },
    );
  }
}
