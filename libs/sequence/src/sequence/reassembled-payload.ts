import { Readable } from 'node:stream';
import { sha256Hasher } from '../core/checksum';
import { SequenceIntegrityError } from '../core/errors/sequence-integrity.error';
import { StoredFragmentIntegrityError } from '../core/errors/stored-fragment-integrity.error';
import type { HeaderMap } from '../core/headers';
import type { CompleteSequence } from '../ports/sequence-store.port';
import { sourceChunks } from '../core/source-chunks';
import type { PayloadDigest } from './intake-digests';

/**
 * A complete, verified sequence as its handler receives it. The bytes stay in the store until the
 * handler asks: `stream()` reads them in order, a piece at a time, without ever building one
 * buffer of the whole payload; `toBuffer()` is there for payloads you know are small.
 */
export class ReassembledPayload {
  readonly channel: string;
  readonly sequenceId: string;
  readonly fragments: number;
  readonly bytes: number;
  /**
   * SHA-256 of the payload, lowercase hex; verified before the handler was called, on the bytes
   * as the producer sent them.
   */
  readonly sha256: string;
  readonly contentType?: string;
  readonly contentEncoding?: string;
  /** The producer's own headers (those given to `send()`). */
  readonly headers: Readonly<HeaderMap>;
  readonly firstFragmentAt: Date;
  readonly lastFragmentAt: Date;
  private mismatch?: SequenceIntegrityError | StoredFragmentIntegrityError;
  private readError?: Error;
  /** The streams handed out and not yet ended; undefined once the payload is closed. */
  private open?: Set<Readable> = new Set();

  /**
   * @param verifyWhileReading when set, every `stream()` checks the bytes read from the store
   * against this digest as the last of them arrives, and fails rather than hand that byte out if
   * they differ (at once on a byte past the count): all of it, or only the byte count when `hash`
   * is false (a store that checks every body it reads against its CRC-32, `verifiesReads`, and
   * reports a mismatch as an integrity failure itself).
   */
  constructor(
    sequence: CompleteSequence & { readonly sha256: string },
    private readonly read: () => Readable,
    private readonly verifyWhileReading?: {
      readonly digest: PayloadDigest;
      readonly hash: boolean;
    },
  ) {
    this.channel = sequence.scope;
    this.sequenceId = sequence.sequenceId;
    this.fragments = sequence.fragments;
    this.bytes = sequence.bytes;
    this.sha256 = sequence.sha256;
    this.contentType = sequence.contentType;
    this.contentEncoding = sequence.contentEncoding;
    this.headers = Object.freeze({ ...sequence.userHeaders });
    this.firstFragmentAt = new Date(sequence.firstFragmentAt);
    this.lastFragmentAt = new Date(sequence.lastFragmentAt);
  }

  /**
   * The payload's bytes in order, read from the store as you consume them. Each call starts over.
   * A stream that errors instead of ending means the store could not give the bytes back (or
   * gave back others): do not keep what you read from it.
   */
  stream(): Readable {
    // What a stream reports once its handler is done says nothing of what the handler got.
    const record = (error: Error): void => {
      if (!this.open) return;
      if (error instanceof StoredFragmentIntegrityError) this.mismatch ??= error;
      else this.readError ??= error;
    };
    const onMismatch = (error: SequenceIntegrityError): void => {
      if (this.open) this.mismatch ??= error;
    };
    // A read that went through to its checked end got the payload: an earlier failed read (a
    // store that stopped answering for a moment) no longer says the handler did not get it.
    const onWhole = (): void => {
      if (this.open) this.readError = undefined;
    };
    // Always a stream of our own around the store's: an error the reader destroys it with (the
    // destination of a pipeline that failed) is the reader's, and must not pass for the store's.
    const stream = Readable.from(
      reading(this.read, this.verifyWhileReading, this.sequenceId, {
        onReadError: record,
        onMismatch,
        onWhole,
      }),
      { objectMode: false, highWaterMark: 1 },
    );
    if (!this.open) {
      stream.destroy(new Error(`sequence ${this.sequenceId}: its handler is done with it`));
      stream.on('error', () => undefined);
      return stream;
    }
    const handedOut = this.open;
    handedOut.add(stream);
    stream.once('close', () => handedOut.delete(stream));
    return stream;
  }

  /**
   * @internal Closes the streams its handler left open, once the handler is done: the bytes are
   * about to go (the store's deleted, the spool file removed), and a stream read on would fail
   * with an error nobody listens to. A later `stream()` errors at once.
   */
  close(): void {
    const streams = this.open;
    this.open = undefined;
    for (const stream of streams ?? []) {
      stream.on('error', () => undefined);
      stream.destroy();
    }
  }

  /** Set when a `stream()` found bytes other than those verified at intake. */
  get integrityFailure(): SequenceIntegrityError | StoredFragmentIntegrityError | undefined {
    return this.mismatch;
  }

  /** Set when a `stream()` could not read the bytes from the store, and none read them since. */
  get readFailure(): Error | undefined {
    return this.readError;
  }

  /** The whole payload in one Buffer. */
  async toBuffer(): Promise<Buffer> {
    const chunks: Buffer[] = [];
    for await (const chunk of this.stream()) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks, this.bytes);
  }
}

/**
 * The store's bytes, passed on as they come; with `verify`, checked against the digest verified
 * at intake (see the constructor). Only what the store's stream throws is recorded as a read
 * failure (see sourceChunks).
 */
async function* reading(
  open: () => Readable,
  verify: { readonly digest: PayloadDigest; readonly hash: boolean } | undefined,
  sequenceId: string,
  on: {
    readonly onReadError: (error: Error) => void;
    readonly onMismatch: (error: SequenceIntegrityError) => void;
    /** The stream reached its end with every byte (and checked them, with `verify`). */
    readonly onWhole: () => void;
  },
): AsyncGenerator<Buffer> {
  const { onReadError, onMismatch, onWhole } = on;
  const hash = verify?.hash ? sha256Hasher() : undefined;
  let bytes = 0;
  const mismatch = (sha256: string): SequenceIntegrityError => {
    const error = new SequenceIntegrityError(sequenceId, verify!.digest, { sha256, bytes });
    onMismatch(error);
    return error;
  };
  // Without hashing, the store vouched for each body's content: only the count is checked.
  const actualSha256 = () => (hash ? hash.copy().digest('hex') : verify!.digest.sha256);
  let verified = false;
  for await (const chunk of sourceChunks(open, onReadError)) {
    hash?.update(chunk);
    bytes += chunk.length;
    if (verify) {
      const { digest } = verify;
      // More than was verified: stop here rather than hand the bytes that pass it.
      if (bytes > digest.bytes) throw mismatch(actualSha256());
      // The last verified byte is checked before it is handed out: a reader that stops at
      // `bytes` never asks for the stream's end. A mismatch is withheld until that end, so that
      // the store's own error comes first if it has one.
      if (bytes === digest.bytes) {
        if (actualSha256() !== digest.sha256) continue;
        verified = true;
      }
    }
    yield chunk;
  }
  // Read back: checked against the declaration just before.
  if (!verify || verified) return onWhole();
  // Fewer bytes than verified (or none were expected), or a mismatch withheld above.
  const sha256 = actualSha256();
  if (sha256 !== verify.digest.sha256 || bytes !== verify.digest.bytes) throw mismatch(sha256);
  onWhole();
}
