import { SequenceError } from './sequence.error';

/**
 * A body read back from a sequence store is not the one the store accepted: its CRC-32 differs
 * from the one recorded when the fragment was stored. The sequence is failed and dead-lettered
 * `integrity-mismatch`, like a SHA-256 mismatch.
 */
export class StoredFragmentIntegrityError extends SequenceError {
  readonly code = 'integrity-mismatch' as const;

  constructor(
    readonly sequenceId: string,
    readonly position: number,
    readonly expectedCrc32: number,
    readonly actualCrc32: number,
  ) {
    super(
      `sequence ${sequenceId}: the body at position ${position} read back from the store has ` +
        `crc32 ${actualCrc32}, it was stored with crc32 ${expectedCrc32}`,
    );
  }
}
