import { randomBytes, type CipherGCM, type DecipherGCM } from 'node:crypto';
import type { PayloadDecryptionFailure } from './errors/payload-decryption.error';
import { encodeHeader, HEADER_BYTES, mayStartHeader, parseHeader } from './encryption-format';
import { GCM_IV_BYTES, GCM_TAG_BYTES, type EncryptionKeyring } from './encryption-keyring';

/*
 * AES-256-GCM of one buffer or stream at rest, in the layout of core/encryption-format.ts: the
 * one implementation behind the encrypting payload store and the stores' body encryption.
 *
 * `context`, when given, is authenticated with the header but not stored: the identity of what
 * was sealed (a store body's sequence and position). Opening with another context fails the tag,
 * so a sealed body copied to another place in a store does not open there.
 */

/** Why sealed bytes did not open; `keyId` when the header named one. */
export class SealedBufferFailure extends Error {
  constructor(
    readonly reason: PayloadDecryptionFailure,
    readonly keyId?: string,
  ) {
    super(`sealed bytes did not open: ${reason}`);
    this.name = 'SealedBufferFailure';
  }
}

/**
 * Starts sealing under the keyring's encryption key: the header to write first, and the cipher
 * for what follows (its tag goes last). A fresh random 96-bit IV every time: NIST SP 800-38D
 * allows 2^32 of them per key before a repeat becomes a real risk, so rotate keys long before.
 */
export function startSealing(
  keyring: EncryptionKeyring,
  context?: Uint8Array,
): { header: Buffer; cipher: CipherGCM } {
  const iv = randomBytes(GCM_IV_BYTES);
  const header = encodeHeader({ keyId: keyring.encryptionKeyId, iv });
  const cipher = keyring.createCipher(iv);
  cipher.setAAD(context === undefined ? header : Buffer.concat([header, context]));
  return { header, cipher };
}

/** Seals a buffer that is already in memory: header, ciphertext and tag in one Buffer. */
export function sealBuffer(
  keyring: EncryptionKeyring,
  plaintext: Uint8Array,
  context?: Uint8Array,
): Buffer {
  const { header, cipher } = startSealing(keyring, context);
  const body = cipher.update(plaintext);
  const last = cipher.final();
  return Buffer.concat([header, body, last, cipher.getAuthTag()]);
}

/**
 * Opens sealed bytes that arrive in parts of any size. Only the last 16 bytes seen are held back
 * (they may be the tag); the rest is deciphered and returned by `update` at once, so memory stays
 * flat whatever the size. That plaintext is unauthenticated until `final` returned: a caller must
 * discard it when `final` (or `update`) throws a {@link SealedBufferFailure}.
 */
export class SealedBufferOpener {
  /** Header bytes while the header is incomplete. */
  #pending: Buffer = Buffer.alloc(0);
  #decipher: DecipherGCM | undefined;
  #keyId: string | undefined;
  /** The last ciphertext bytes seen, at most GCM_TAG_BYTES: the tag, if the bytes end here. */
  #tail: Buffer = Buffer.alloc(0);

  constructor(
    private readonly keyring: EncryptionKeyring,
    private readonly context?: Uint8Array,
  ) {}

  /** The key id the header named, once the header was read and the key found. */
  get keyId(): string | undefined {
    return this.#decipher && this.#keyId;
  }

  /**
   * Takes the next sealed bytes; returns the plaintext they release (possibly none).
   * @throws SealedBufferFailure `malformed-header` or `unknown-key`, once the header is complete.
   */
  update(part: Uint8Array): Buffer[] {
    let body = Buffer.from(part.buffer, part.byteOffset, part.byteLength);
    let decipher = this.#decipher;
    if (decipher === undefined) {
      const seen = Buffer.concat([this.#pending, body]);
      if (seen.length < HEADER_BYTES) {
        this.#pending = seen;
        return [];
      }
      this.#pending = Buffer.alloc(0);
      decipher = this.#start(seen.subarray(0, HEADER_BYTES));
      body = seen.subarray(HEADER_BYTES);
    }
    return this.#decipherAllButTail(body, decipher);
  }

  /**
   * Checks the tag: returns the last plaintext, if any, once everything returned is authentic.
   * @throws SealedBufferFailure `truncated` or `authentication-failed` (or a header failure).
   */
  final(): Buffer[] {
    const decipher = this.#decipher;
    // Ended inside the header: cut short, or not sealed at all (plaintext shorter than a header;
    // nothing at all, as an empty body or the headers "{}" of a sequence stored before, decode).
    if (decipher === undefined && (this.#pending.length === 0 || !mayStartHeader(this.#pending))) {
      throw new SealedBufferFailure('malformed-header');
    }
    if (decipher === undefined || this.#tail.length < GCM_TAG_BYTES) {
      throw new SealedBufferFailure('truncated', this.#keyId);
    }
    try {
      decipher.setAuthTag(this.#tail);
      return nonEmpty(decipher.final());
    } catch {
      throw new SealedBufferFailure('authentication-failed', this.#keyId);
    }
  }

  #start(headerBytes: Buffer): DecipherGCM {
    const header = parseHeader(headerBytes);
    if (header === undefined) throw new SealedBufferFailure('malformed-header');
    this.#keyId = header.keyId;
    const decipher = this.keyring.createDecipher(header.keyId, header.iv);
    if (decipher === undefined) throw new SealedBufferFailure('unknown-key', header.keyId);
    const context = this.context;
    decipher.setAAD(context === undefined ? headerBytes : Buffer.concat([headerBytes, context]));
    this.#decipher = decipher;
    return decipher;
  }

  /** Deciphers all but the last GCM_TAG_BYTES of (tail + body); those become the new tail. */
  #decipherAllButTail(body: Buffer, decipher: DecipherGCM): Buffer[] {
    if (body.length >= GCM_TAG_BYTES) {
      // The common case: no copy of the part, only of its last 16 bytes.
      const released = [
        ...nonEmpty(decipher.update(this.#tail)),
        ...nonEmpty(decipher.update(body.subarray(0, body.length - GCM_TAG_BYTES))),
      ];
      this.#tail = Buffer.from(body.subarray(body.length - GCM_TAG_BYTES));
      return released;
    }
    const combined = Buffer.concat([this.#tail, body]);
    const release = Math.max(0, combined.length - GCM_TAG_BYTES);
    this.#tail = combined.subarray(release);
    return nonEmpty(decipher.update(combined.subarray(0, release)));
  }
}

/** Opens a sealed buffer that is already in memory. @throws SealedBufferFailure */
export function openBuffer(
  keyring: EncryptionKeyring,
  sealed: Uint8Array,
  context?: Uint8Array,
): Buffer {
  const opener = new SealedBufferOpener(keyring, context);
  const parts = [...opener.update(sealed), ...opener.final()];
  return parts.length === 1 ? parts[0] : Buffer.concat(parts);
}

function nonEmpty(bytes: Buffer): Buffer[] {
  return bytes.length > 0 ? [bytes] : [];
}
