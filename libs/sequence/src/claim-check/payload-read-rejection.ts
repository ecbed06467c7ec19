import { PayloadDecryptionError } from '../core/errors/payload-decryption.error';
import { ClaimCheckIntegrityError } from '../core/errors/claim-check-integrity.error';
import { ClaimCheckNotFoundError } from '../core/errors/claim-check-not-found.error';
import { InvalidPayloadRefError } from '../core/errors/invalid-payload-ref.error';
import { PayloadMetadataCorruptError } from '../core/errors/payload-metadata-corrupt.error';

/**
 * Why reading a parked payload (its metadata or its bytes) failed for good, as the code to
 * dead-letter its message with; undefined for a failure that may pass (a store outage: requeue).
 * - the payload is gone, never was, or its ref is one the store refuses: `claim-check-not-found`;
 * - its bytes do not match the ticket or fail decryption, or the store cannot read its metadata:
 *   `integrity-mismatch` (reading again would find the same bytes).
 */
export function payloadReadRejection(
  error: unknown,
): 'claim-check-not-found' | 'integrity-mismatch' | undefined {
  if (error instanceof ClaimCheckNotFoundError || error instanceof InvalidPayloadRefError) {
    return 'claim-check-not-found';
  }
  if (
    error instanceof ClaimCheckIntegrityError ||
    error instanceof PayloadDecryptionError ||
    error instanceof PayloadMetadataCorruptError
  ) {
    return 'integrity-mismatch';
  }
  return undefined;
}
