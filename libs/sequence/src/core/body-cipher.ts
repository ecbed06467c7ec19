import type { PayloadEncryptionKey } from './encryption-key';
import { ENCRYPTION_OVERHEAD_BYTES } from './encryption-format';
import { EncryptionKeyring, keysObjectProblem } from './encryption-keyring';
import { SequenceOptionsError } from './errors/sequence-options.error';
import type { HeaderMap } from './headers';
import { openBuffer, sealBuffer, SealedBufferFailure, SealedBufferOpener } from './sealed-buffer';

/** AES-256-GCM of what a store keeps at rest (the `encryption` option of the stores). */
export interface StoreEncryptionOptions {
  /**
   * AES-256 keys, as for the encrypting payload store: the first encrypts what is stored from
   * now on, every one decrypts, so keys rotate. Put the new key first and keep the old ones
   * listed until what was stored under them has finished (the sequences' expiry and retention).
   */
  readonly keys: readonly PayloadEncryptionKey[];
}

/**
 * Where a sealed value belongs: authenticated with it, not stored. A value opens only under the
 * identity it was sealed with, so one copied to another sequence, position or field fails the
 * tag like a damaged one.
 */
export type SealedIdentity = readonly (string | number)[];

/**
 * Seals and opens the values a store keeps (bodies, user headers), each under a fresh random IV,
 * bound to its identity, in the format of the encrypting payload store (core/encryption-format.ts;
 * {@link BodyCipher.overheadBytes} more than the plaintext). Budgets and checks stay on the
 * plaintext: a store counts and checks what it was given, and stores what this returns.
 */
export class BodyCipher {
  /** Bytes a sealed value takes beyond its plaintext: header (key id, IV) and tag. */
  static readonly overheadBytes = ENCRYPTION_OVERHEAD_BYTES;
  private readonly keyring: EncryptionKeyring;

  /**
   * @param where names the option in errors (`RedisSequenceStore encryption`).
   * @throws SequenceOptionsError when `options` is not an object, or a key is missing, malformed
   *   or not 32 bytes.
   */
  constructor(options: StoreEncryptionOptions, where: string) {
    const notAnObject = keysObjectProblem(options);
    if (notAnObject) {
      throw new SequenceOptionsError(where, [`${notAnObject} (leave it out for no encryption)`]);
    }
    this.keyring = new EncryptionKeyring(options.keys, `${where} keys`);
  }

  /** The id of the key new values are sealed under. */
  get encryptionKeyId(): string {
    return this.keyring.encryptionKeyId;
  }

  seal(plaintext: Uint8Array, identity: SealedIdentity): Buffer {
    return sealBuffer(this.keyring, plaintext, identityBytes(identity));
  }

  /** @throws SealedBufferFailure when the value does not open (altered, other key or identity). */
  open(sealed: Uint8Array, identity: SealedIdentity): Buffer {
    return openBuffer(this.keyring, sealed, identityBytes(identity));
  }

  /** Opens a sealed value that is read in parts (see {@link SealedBufferOpener}). */
  opener(identity: SealedIdentity): SealedBufferOpener {
    return new SealedBufferOpener(this.keyring, identityBytes(identity));
  }
}

function identityBytes(identity: SealedIdentity): Buffer {
  return Buffer.from(JSON.stringify(identity));
}

/** Identity of a fragment body in a sequence store. */
export function sequenceBodyIdentity(
  ref: { readonly scope: string; readonly sequenceId: string },
  position: number,
): SealedIdentity {
  return ['sequence-body', ref.scope, ref.sequenceId, position];
}

/** Identity of the user headers a sequence store keeps with a sequence. */
export function sequenceHeadersIdentity(ref: {
  readonly scope: string;
  readonly sequenceId: string;
}): SealedIdentity {
  return ['sequence-headers', ref.scope, ref.sequenceId];
}

/**
 * Opens the sealed JSON of a sequence's user headers; when they do not open, no headers and the
 * reason to fail the sequence with (`CompleteSequence.integrityFailure`).
 */
export function openUserHeaders(
  cipher: BodyCipher,
  sealed: Uint8Array,
  ref: { readonly scope: string; readonly sequenceId: string },
): { readonly headers: HeaderMap; readonly failure?: string } {
  try {
    const json = cipher.open(sealed, sequenceHeadersIdentity(ref)).toString();
    return { headers: JSON.parse(json) as HeaderMap };
  } catch (error) {
    if (!(error instanceof SealedBufferFailure)) throw error;
    return {
      headers: {},
      failure:
        `sequence ${ref.sequenceId}: the user headers kept in the store did not decrypt ` +
        `(${error.reason}): they were altered in the store, or their key is not configured`,
    };
  }
}
