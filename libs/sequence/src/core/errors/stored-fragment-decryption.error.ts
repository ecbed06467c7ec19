import type { PayloadDecryptionFailure } from './payload-decryption.error';
import { StoredFragmentIntegrityError } from './stored-fragment-integrity.error';

/**
 * A body a store keeps encrypted did not decrypt when read back: it was altered in the store,
 * moved from another sequence or position, or its key is not configured. An integrity failure
 * like a CRC-32 mismatch (`integrity-mismatch`: the sequence is dead-lettered, never delivered);
 * `expectedCrc32` is the CRC-32 the body was stored with, `actualCrc32` NaN (nothing to check).
 */
export class StoredFragmentDecryptionError extends StoredFragmentIntegrityError {
  constructor(
    sequenceId: string,
    position: number,
    expectedCrc32: number,
    readonly reason: PayloadDecryptionFailure,
    /** The key id the stored body names, when it could be read. */
    readonly keyId?: string,
  ) {
    super(sequenceId, position, expectedCrc32, Number.NaN);
    this.message =
      `sequence ${sequenceId}: the body at position ${position} read back from the store did ` +
      `not decrypt (${reason}${keyId === undefined ? '' : `, key id ${JSON.stringify(keyId)}`}): ` +
      (reason === 'unknown-key'
        ? 'add that key to the store encryption keys (keep retired keys listed while sequences stored under them remain)'
        : 'it was altered in the store, or the key under that id is not the one it was written with');
  }
}
