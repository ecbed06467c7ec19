import { SequenceError } from './sequence.error';

/** Why an encrypted payload could not be read back. None of them heals by retrying. */
export type PayloadDecryptionFailure =
  /**
   * The stored bytes do not start with this format's header: stored before encryption was
   * turned on, written by something else, or damaged in the header.
   */
  | 'malformed-header'
  /** The payload was encrypted under a key id this side is not configured with. */
  | 'unknown-key'
  /** The stored bytes end before the header and the authentication tag are complete. */
  | 'truncated'
  /**
   * The authentication tag does not match: the stored bytes were altered (header, ciphertext
   * or tag), or the key configured under this id is not the one that encrypted the payload.
   */
  | 'authentication-failed';

const ADVICE: Record<PayloadDecryptionFailure, string> = {
  'malformed-header': 'it is not an encrypted payload of this format',
  'unknown-key':
    'add the key to the payload encryption keys (keep retired keys listed while payloads encrypted under them remain)',
  truncated: 'the store returned fewer bytes than were written',
  'authentication-failed':
    'the stored bytes were altered, or this key id maps to other key material than the writer used; discard everything read from this stream',
};

/** An encrypted payload failed to decrypt or to authenticate; see `reason`. */
export class PayloadDecryptionError extends SequenceError {
  readonly code = 'payload-decryption-failed' as const;

  constructor(
    readonly store: string,
    readonly ref: string,
    readonly reason: PayloadDecryptionFailure,
    /** The key id named in the payload's header, when it could be read. */
    readonly keyId?: string,
  ) {
    super(
      `the ${store} payload store's payload ${JSON.stringify(ref)} failed to decrypt ` +
        `(${reason}${keyId === undefined ? '' : `, key id ${JSON.stringify(keyId)}`}): ${ADVICE[reason]}`,
    );
  }
}
