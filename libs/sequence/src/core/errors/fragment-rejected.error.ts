import { SequenceError } from './sequence.error';
import type { RejectionCode } from './rejection-code';

/**
 * A well-formed fragment that cannot be accepted: bad checksum, contradicts the rest of its
 * sequence, or breaks a limit. The fragment is dead-lettered; other sequences are unaffected.
 */
export class FragmentRejectedError extends SequenceError {
  constructor(
    readonly code: RejectionCode,
    readonly sequenceId: string,
    readonly position: number,
    readonly detail: string,
  ) {
    super(`sequence ${sequenceId} fragment ${position}: ${code}: ${detail}`);
  }
}
