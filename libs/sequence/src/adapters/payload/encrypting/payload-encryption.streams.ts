import type { CipherGCM } from 'node:crypto';
import { Transform, type TransformCallback } from 'node:stream';
import type { PayloadDecryptionFailure } from '../../../core/errors/payload-decryption.error';
import type { EncryptionKeyring } from '../../../core/encryption-keyring';
import { asError } from '../../../core/errors/caught';
import { SealedBufferFailure, SealedBufferOpener, startSealing } from '../../../core/sealed-buffer';

/** Builds the error a {@link DecryptingStream} fails with; the store adds the ref. */
export type DecryptionFailureFactory = (reason: PayloadDecryptionFailure, keyId?: string) => Error;

/** Encrypts a stream as it flows: header first, each chunk as it comes, the tag at the end. */
export class EncryptingStream extends Transform {
  #header: Buffer | undefined;
  readonly #cipher: CipherGCM;

  constructor(keyring: EncryptionKeyring) {
    super();
    const { header, cipher } = startSealing(keyring);
    this.#header = header;
    this.#cipher = cipher;
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    try {
      this.#pushHeader();
      pushSome(this, [this.#cipher.update(chunk)]);
      callback();
    } catch (error) {
      callback(error as Error);
    }
  }

  override _flush(callback: TransformCallback): void {
    try {
      this.#pushHeader();
      pushSome(this, [this.#cipher.final()]);
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
 * Decrypts a stored payload as it flows (core/sealed-buffer.ts `SealedBufferOpener`): only the
 * last 16 bytes seen are held back, so memory stays flat whatever the payload's size.
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
  readonly #opener: SealedBufferOpener;

  constructor(
    keyring: EncryptionKeyring,
    private readonly fail: DecryptionFailureFactory,
  ) {
    super();
    this.#opener = new SealedBufferOpener(keyring);
    this.header = new Promise<string>((resolve, reject) => {
      this.#settleHeader = (error, keyId) => (error ? reject(error) : resolve(keyId as string));
    });
    // Settled whether or not anyone awaits it; a rejection nobody waits for is no crash.
    this.header.catch(() => undefined);
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    this.#run(callback, () => {
      const released = this.#opener.update(chunk);
      const keyId = this.#opener.keyId;
      if (keyId !== undefined) this.#settleHeader(undefined, keyId);
      return released;
    });
  }

  override _flush(callback: TransformCallback): void {
    this.#run(callback, () => this.#opener.final());
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    // A no-op when the header was read already.
    this.#settleHeader(error ?? new Error('the stream was closed before its header was read'));
    callback(error);
  }

  #run(callback: TransformCallback, step: () => Buffer[]): void {
    let released: Buffer[];
    try {
      released = step();
    } catch (error) {
      return callback(
        error instanceof SealedBufferFailure
          ? this.fail(error.reason, error.keyId)
          : asError(error),
      );
    }
    pushSome(this, released);
    callback();
  }
}

function pushSome(stream: Transform, parts: readonly Buffer[]): void {
  for (const part of parts) if (part.length > 0) stream.push(part);
}
