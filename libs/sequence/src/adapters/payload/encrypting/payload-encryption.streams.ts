import { randomBytes, type CipherGCM, type DecipherGCM } from 'node:crypto';
import { Transform, type TransformCallback } from 'node:stream';
import type { PayloadDecryptionFailure } from '../../../core/errors/payload-decryption.error';
import { encodeHeader, HEADER_BYTES, parseHeader } from './payload-encryption.format';
import { GCM_IV_BYTES, GCM_TAG_BYTES, type PayloadKeyring } from './payload-encryption.keys';

/** Builds the error a {@link DecryptingStream} fails with; the store adds the ref. */
export type DecryptionFailureFactory = (reason: PayloadDecryptionFailure, keyId?: string) => Error;

/**
 * A fresh random IV per payload: with 96 random bits, NIST SP 800-38D allows 2^32 payloads per
 * key before an IV repeat becomes a real risk, so rotate keys long before that.
 */
function startEncryption(keyring: PayloadKeyring): { header: Buffer; cipher: CipherGCM } {
  const iv = randomBytes(GCM_IV_BYTES);
  const header = encodeHeader({ keyId: keyring.encryptionKeyId, iv });
  const cipher = keyring.createCipher(iv);
  cipher.setAAD(header);
  return { header, cipher };
}

/** Encrypts a payload that is already in memory (header, ciphertext, tag in one Buffer). */
export function encryptBuffer(keyring: PayloadKeyring, plaintext: Uint8Array): Buffer {
  const { header, cipher } = startEncryption(keyring);
  const body = cipher.update(plaintext);
  const last = cipher.final();
  return Buffer.concat([header, body, last, cipher.getAuthTag()]);
}

/** Encrypts a stream as it flows: header first, each chunk as it comes, the tag at the end. */
export class EncryptingStream extends Transform {
  #header: Buffer | undefined;
  readonly #cipher: CipherGCM;

  constructor(keyring: PayloadKeyring) {
    super();
    const { header, cipher } = startEncryption(keyring);
    this.#header = header;
    this.#cipher = cipher;
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    try {
      this.#pushHeader();
      pushSome(this, this.#cipher.update(chunk));
      callback();
    } catch (error) {
      callback(error as Error);
    }
  }

  override _flush(callback: TransformCallback): void {
    try {
      this.#pushHeader();
      pushSome(this, this.#cipher.final());
      this.push(this.#cipher.getAuthTag());
      callback();
    } catch (error) {
      callback(error as Error);
    }
  }

  #pushHeader(): void {
    if (this.#header === undefined) return;
    this.push(this.#header);
    this.#header = undefined;
  }
}

/**
 * Decrypts a stored payload as it flows. Only the last 16 bytes seen are held back (they may be
 * the tag); everything before them is deciphered and passed on at once, so memory stays flat
 * whatever the payload's size.
 *
 * That means plaintext is released before the tag has been checked, which GCM can only do at
 * the end. A forged or damaged payload is caught there: the stream then fails with an
 * `authentication-failed` error instead of ending. A consumer must therefore treat what it read
 * as untrusted until the stream ended cleanly (the Claim Check's SHA-256 check works the same
 * way), and discard it on an error.
 *
 * `header` settles once the header was read: it resolves with the key id, or rejects (bad
 * header, unknown key, too short, or any stream error before then), so a reader can refuse a
 * payload before handing its stream on.
 */
export class DecryptingStream extends Transform {
  readonly header: Promise<string>;
  #settleHeader!: (error: Error | undefined, keyId?: string) => void;
  /** Header bytes while the header is incomplete. */
  #pending: Buffer = Buffer.alloc(0);
  #decipher: DecipherGCM | undefined;
  #keyId: string | undefined;
  /** The last ciphertext bytes seen, at most GCM_TAG_BYTES: the tag, if the payload ends here. */
  #tail: Buffer = Buffer.alloc(0);

  constructor(
    private readonly keyring: PayloadKeyring,
    private readonly fail: DecryptionFailureFactory,
  ) {
    super();
    this.header = new Promise<string>((resolve, reject) => {
      this.#settleHeader = (error, keyId) => (error ? reject(error) : resolve(keyId as string));
    });
    // Settled whether or not anyone awaits it; a rejection nobody waits for is no crash.
    this.header.catch(() => undefined);
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    try {
      let decipher = this.#decipher;
      let body = chunk;
      if (decipher === undefined) {
        const seen = Buffer.concat([this.#pending, chunk]);
        if (seen.length < HEADER_BYTES) {
          this.#pending = seen;
          return callback();
        }
        this.#pending = Buffer.alloc(0);
        const started = this.#start(seen.subarray(0, HEADER_BYTES));
        if (started instanceof Error) return callback(started);
        decipher = started;
        body = seen.subarray(HEADER_BYTES);
      }
      this.#decipherAllButTail(body, decipher);
      callback();
    } catch (error) {
      callback(error as Error);
    }
  }

  override _flush(callback: TransformCallback): void {
    const decipher = this.#decipher;
    if (decipher === undefined || this.#tail.length < GCM_TAG_BYTES) {
      return callback(this.fail('truncated', this.#keyId));
    }
    try {
      decipher.setAuthTag(this.#tail);
      pushSome(this, decipher.final());
    } catch {
      return callback(this.fail('authentication-failed', this.#keyId));
    }
    callback();
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    // A no-op when the header was read already.
    this.#settleHeader(error ?? new Error('the stream was closed before its header was read'));
    callback(error);
  }

  /** Parses the header and sets up the decipher, or returns the error to fail with. */
  #start(headerBytes: Buffer): DecipherGCM | Error {
    const header = parseHeader(headerBytes);
    if (header === undefined) return this.fail('malformed-header');
    this.#keyId = header.keyId;
    const decipher = this.keyring.createDecipher(header.keyId, header.iv);
    if (decipher === undefined) return this.fail('unknown-key', header.keyId);
    decipher.setAAD(headerBytes);
    this.#decipher = decipher;
    this.#settleHeader(undefined, header.keyId);
    return decipher;
  }

  /** Deciphers all but the last GCM_TAG_BYTES of (tail + body); those become the new tail. */
  #decipherAllButTail(body: Buffer, decipher: DecipherGCM): void {
    if (body.length >= GCM_TAG_BYTES) {
      // The common case: no copy of the chunk, only of its last 16 bytes.
      pushSome(this, decipher.update(this.#tail));
      pushSome(this, decipher.update(body.subarray(0, body.length - GCM_TAG_BYTES)));
      this.#tail = Buffer.from(body.subarray(body.length - GCM_TAG_BYTES));
      return;
    }
    const combined = Buffer.concat([this.#tail, body]);
    const release = Math.max(0, combined.length - GCM_TAG_BYTES);
    pushSome(this, decipher.update(combined.subarray(0, release)));
    this.#tail = combined.subarray(release);
  }
}

function pushSome(stream: Transform, bytes: Buffer): void {
  if (bytes.length > 0) stream.push(bytes);
}
