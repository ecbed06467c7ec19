import { SequenceError } from './sequence.error';

/**
 * A body read back from a sequence store is not the one the store accepted: its CRC-32 differs
 * from the one recorded when the fragment was stored. The sequence is failed and dead-lettered
 * `integrity-mismatch`, like a SHA-256 mismatch. With `from: 'spool'`, a body read back from
 * broker-held reassembly's spool file: its fragments are spooled again from the broker first.
 */
export class StoredFragmentIntegrityError extends SequenceError {
  readonly code = 'integrity-mismatch' as const;

  constructor(
    readonly sequenceId: string,
    readonly position: number,
    readonly expectedCrc32: number,
    readonly actualCrc32: number,
    readonly from: 'store' | 'spool' = 'store',
  ) {
    super(
      `sequence ${sequenceId}: the body at position ${position} read back from the ${from} has ` +
        `crc32 ${actualCrc32}, it was ${from === 'store' ? 'stored' : 'spooled'} with crc32 ` +
        `${expectedCrc32}`,
    );
  }
}
