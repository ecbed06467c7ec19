import { type PayloadEncryptionKey } from '../../../core/encryption-key';
import { pipeline, type Readable } from 'node:stream';
import type {
  GetOptions,
  PayloadInfo,
  PayloadStore,
  PutOptions,
  StoredPayload,
  SweepCandidate,
  SweepQuery,
} from '../../../ports/payload-store.port';
import { PayloadDecryptionError } from '../../../core/errors/payload-decryption.error';
import { abortReason } from '../../../core/async';
import { ENCRYPTION_OVERHEAD_BYTES } from '../../../core/encryption-format';
import { EncryptionKeyring, keysObjectProblem } from '../../../core/encryption-keyring';
import { sealBuffer } from '../../../core/sealed-buffer';
import { DecryptingStream, EncryptingStream } from './payload-encryption.streams';
import { byteChunks } from '../../../core/payload-source';
import { kindOf, refuseUnknownKeys, type OptionKeysOf } from '../../../core/option-keys';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';

/** Options of {@link EncryptingPayloadStore}. */
export interface EncryptingPayloadStoreOptions {
  /**
   * AES-256 keys: the first encrypts new payloads, every one decrypts, so keys rotate. Put the
   * new key first and keep the old ones listed while payloads encrypted under them remain
   * (until their `expiresAt` has passed and the sweeper ran).
   */
  readonly keys: readonly PayloadEncryptionKey[];
}

const ENCRYPTING_PAYLOAD_STORE_KEYS = {
  keys: true,
} as const satisfies OptionKeysOf<EncryptingPayloadStoreOptions>;

/**
 * Encryption at rest for any {@link PayloadStore}: AES-256-GCM, streamed both ways, a random
 * 96-bit IV per payload, the key id in a header (see core/encryption-format.ts), the tag at
 * the end. Wrapped around a store, it stores only ciphertext there and is itself a PayloadStore
 * of the plaintext: `get` streams plaintext, `put` and `head` report plaintext sizes, and the
 * name is the inner store's, so tickets do not change when encryption is turned on.
 *
 * Reading: `get` resolves once the payload's header was read and its key found, and rejects
 * with {@link PayloadDecryptionError} (`malformed-header`, `unknown-key`, `truncated`)
 * otherwise. The stream it resolves releases plaintext before the authentication tag at the end
 * could be checked; when the tag fails (any stored byte altered, or other key material under the
 * key id) the stream errors with `authentication-failed` instead of ending. Treat what you read
 * as untrusted until the stream ended cleanly.
 *
 * What it does not do: bind a ciphertext to its ref (the store generates the ref after the
 * bytes are written), so a party able to write the inner store could swap two payloads
 * encrypted under one key; the claim ticket's signed SHA-256 of the plaintext catches that.
 * Payloads stored before encryption was turned on fail with `malformed-header`: let them expire
 * first. One payload may hold up to 64 GiB (the GCM limit per IV).
 *
 * @example
 * const payloads = new EncryptingPayloadStore(new FilesystemPayloadStore({ root }), {
 *   keys: [{ id: '2026-11', key: process.env.PAYLOAD_KEY! }],
 * });
 */
export class EncryptingPayloadStore implements PayloadStore {
  readonly name: string;
  private readonly keyring: EncryptionKeyring;

  /**
   * The inner store's `deleteUnpublished`, passed through, when it has one; absent when it has
   * none, so that the orphan sweeper (`deleteIfUnpublished`) and the PayloadStore conformance
   * suite see the store as it is: one whose orphan delete re-reads the payload first, not one
   * claiming a check-and-delete of its own. (`declare`: absent, not an own `undefined`.)
   */
  declare readonly deleteUnpublished?: (ref: string) => Promise<boolean>;

  /** @throws SequenceOptionsError when a key is missing, malformed or not 32 bytes. */
  constructor(
    private readonly inner: PayloadStore,
    options: EncryptingPayloadStoreOptions,
  ) {
    const problems: string[] = [];
    if (typeof inner !== 'object' || inner === null) {
      problems.push(`the store to wrap must be a PayloadStore, got ${kindOf(inner)}`);
    }
    const notAnObject = keysObjectProblem(options);
    if (notAnObject) problems.push(`options ${notAnObject}`);
    if (problems.length > 0) throw new SequenceOptionsError('EncryptingPayloadStore', problems);
    refuseUnknownKeys('EncryptingPayloadStore options', options, ENCRYPTING_PAYLOAD_STORE_KEYS);
    this.name = inner.name;
    this.keyring = new EncryptionKeyring(options.keys);
    if (typeof inner.deleteUnpublished === 'function') {
      this.deleteUnpublished = inner.deleteUnpublished.bind(inner);
    }
  }

  /** The wrapped store's: it keeps what it keeps. */
  get expiredRetentionMs(): number | undefined {
    return this.inner.expiredRetentionMs;
  }

  async put(payload: Buffer | Readable, options: PutOptions): Promise<StoredPayload> {
    if (payload instanceof Uint8Array) {
      // Already in memory: one ciphertext Buffer keeps the inner store's Buffer path.
      const stored = await this.inner.put(sealBuffer(this.keyring, payload), options);
      return { ref: stored.ref, bytes: plaintextBytes(stored.bytes) };
    }
    const encrypting = new EncryptingStream(this.keyring);
    // pipeline, not pipe: a source that fails or is destroyed early fails `encrypting` with the
    // same error, so the inner put rejects with the cause and keeps nothing.
    // Chunks that are not bytes fail the pipeline, and so the inner put (see byteChunks).
    pipeline(payload, byteChunks, encrypting, () => undefined);
    try {
      const stored = await this.inner.put(encrypting, options);
      return { ref: stored.ref, bytes: plaintextBytes(stored.bytes) };
    } catch (error) {
      // The source too, now: through the pipeline it would close a tick after the rejection.
      encrypting.destroy();
      payload.destroy();
      throw error;
    }
  }

  async get(ref: string, options: GetOptions = {}): Promise<Readable> {
    const stored = await this.inner.get(ref, options);
    const decrypting = new DecryptingStream(
      this.keyring,
      (reason, keyId) => new PayloadDecryptionError(this.name, ref, reason, keyId),
    );
    pipeline(stored, decrypting, () => undefined);
    // Waiting for the header, the stream is not the caller's yet: if the store stalls before
    // its first byte, only the caller's signal can close it (and, through the pipeline, `stored`).
    const { signal } = options;
    const abandon = () => decrypting.destroy(abortReason(signal!));
    if (signal?.aborted) abandon();
    signal?.addEventListener('abort', abandon, { once: true });
    try {
      await decrypting.header;
    } finally {
      signal?.removeEventListener('abort', abandon);
    }
    return decrypting;
  }

  async head(ref: string): Promise<PayloadInfo | undefined> {
    const info = await this.inner.head(ref);
    return info && { ...info, bytes: plaintextBytes(info.bytes) };
  }

  delete(ref: string): Promise<boolean> {
    return this.inner.delete(ref);
  }

  markPublished(ref: string): Promise<boolean> {
    return this.inner.markPublished(ref);
  }

  sweepCandidates(query: SweepQuery): Promise<SweepCandidate[]> {
    return this.inner.sweepCandidates(query);
  }

  ping(): Promise<void> {
    return this.inner.ping();
  }

  /** Closes the inner store: the wrapper owns what it wraps. */
  close(): Promise<void> {
    return this.inner.close();
  }
}

/**
 * The overhead is the same for every payload of this format, so the plaintext size needs no
 * read. A stored object shorter than the overhead is not one of ours (its `get` fails); it is
 * reported as empty rather than as a negative size.
 */
function plaintextBytes(storedBytes: number): number {
  return Math.max(0, storedBytes - ENCRYPTION_OVERHEAD_BYTES);
}
