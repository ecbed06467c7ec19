import { SequenceError } from './sequence.error';
import type { RejectionCode } from './rejection-code';

/** A fragment's headers break the wire contract; the fragment is dead-lettered. */
export class MalformedFragmentError extends SequenceError {
  constructor(
    readonly code: Extract<RejectionCode, 'malformed-header' | 'unsupported-version'>,
    /** The header at fault. */
    readonly header: string,
    readonly detail: string,
    /** The sequence id, when it could be read. */
    readonly sequenceId?: string,
  ) {
    super(`${header}: ${detail}${sequenceId ? ` (sequence ${sequenceId})` : ''}`);
  }
}
