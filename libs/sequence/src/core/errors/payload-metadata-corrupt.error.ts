import { SequenceError } from './sequence.error';

/**
 * A payload store holds metadata for a payload that it cannot read back (not JSON, or not of the
 * shape the store writes): damaged on disk, or written by something else. Final: reading again
 * would find the same bytes, so Claim Check dead-letters the message (`integrity-mismatch`)
 * rather than retrying it as an outage.
 */
export class PayloadMetadataCorruptError extends SequenceError {
  readonly code = 'integrity-mismatch' as const;

  constructor(
    readonly store: string,
    /** The payload's ref, or the file that holds its metadata. */
    readonly ref: string,
    readonly why: string,
  ) {
    super(`the ${store} payload store cannot read the metadata of ${ref}: ${why}`);
  }
}
