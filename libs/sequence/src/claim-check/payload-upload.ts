import { Readable, Transform, pipeline, type TransformCallback } from 'node:stream';
import { withTimeout } from '../core/async';
import { sha256Hasher, sha256Hex } from '../core/checksum';
import { asError } from '../core/errors/caught';
import { PayloadStoreTimeoutError } from '../core/errors/payload-store-timeout.error';
import { byteChunks } from '../core/payload-source';
import type { PayloadStore, PutOptions, StoredPayload } from '../ports/payload-store.port';

/**
 * A payload of bytes up to this size is one wait of its upload; a larger one is handed over in
 * slices of this size (S3's default part: each slice is a part, uncopied).
 */
const SLICE_BYTES = 8 * 1024 * 1024;

/** A payload in its store, with the digest its ticket carries. */
export interface UploadedPayload {
  readonly ref: string;
  readonly sha256: string;
  readonly bytes: number;
}

/**
 * Streams `payload` into `store` (a Readable is never buffered whole), hashing it on the way, and
 * gives up with `PayloadStoreTimeoutError` (`put`) once the store has held the upload up for `ms`
 * (`claimCheck.writeTimeoutMs`): it took none of the bytes waiting for it, or did not answer once
 * it had them all. Time spent waiting on the caller's stream does not count. Bytes up to 8 MiB
 * are one wait (the store shows no progress through them); larger ones are handed over in 8 MiB
 * slices, as a stream.
 *
 * Given up on, a stream is destroyed with the error (the caller's source with it), so a store
 * that answers again finds its put failed and keeps nothing. A put that resolves all the same
 * goes to `late`: no ticket will name its payload.
 * @throws the store's error, or PayloadStoreTimeoutError
 */
export async function uploadPayload(
  store: PayloadStore,
  payload: Buffer | Readable,
  options: PutOptions,
  ms: number,
  late: (stored: StoredPayload) => void,
): Promise<UploadedPayload> {
  const timeout = () => new PayloadStoreTimeoutError(store.name, '', 'put', ms);
  if (Buffer.isBuffer(payload) && payload.length <= SLICE_BYTES) {
    const putting = (async () => store.put(payload, options))();
    const { ref } = await orLate(putting, withTimeout(putting, ms, timeout), late);
    return { ref, sha256: sha256Hex(payload), bytes: payload.length };
  }
  const source = Buffer.isBuffer(payload) ? Readable.from(slices(payload)) : payload;
  const meter = new DigestingStream();
  // Errors reach put through `meter`; chunks that are not bytes fail it (see byteChunks). Once
  // the pipeline is over, nothing else may listen: destroying `meter` with the put's failure
  // must not be an uncaught 'error'.
  meter.on('error', () => undefined);
  pipeline(source, byteChunks, meter, () => undefined);
  try {
    const putting = (async () => store.put(meter, options))();
    const { ref } = await orLate(putting, whileTaken(putting, meter, ms, timeout), late);
    return { ref, ...meter.digest() };
  } catch (error) {
    // A store that refused before reading would leave the caller's stream (a file) open; one
    // given up on must find its source failed when it reads on.
    meter.destroy(asError(error));
    throw error;
  }
}

/** `bounded`; when it gave up on `putting`, `putting`'s late payload goes to `late`. */
async function orLate<T extends StoredPayload>(
  putting: Promise<T>,
  bounded: Promise<T>,
  late: (stored: T) => void,
): Promise<T> {
  try {
    return await bounded;
  } catch (error) {
    // `late` never throws into nothing: a rejection here would be unhandled.
    if (error instanceof PayloadStoreTimeoutError) putting.then(late).catch(() => undefined);
    throw error;
  }
}

/**
 * `putting`, rejected with `timeout()` once the store has held `meter` up for `ms`: bytes waited
 * for it (in `meter`, or all of them once the source ended) with none taken meanwhile.
 */
function whileTaken<T>(
  putting: Promise<T>,
  meter: DigestingStream,
  ms: number,
  timeout: () => Error,
): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let taken = meter.taken;
    let since = performance.now();
    const watch = setInterval(
      () => {
        const now = performance.now();
        // Once the source has ended, whatever is left to do is the store's.
        const held = meter.readableLength > 0 || meter.writableFinished;
        if (!held || meter.taken !== taken) {
          taken = meter.taken;
          since = now;
        } else if (now - since >= ms) {
          clearInterval(watch);
          reject(timeout());
        }
      },
      Math.max(10, Math.min(1_000, Math.floor(ms / 4))),
    );
    putting.then(
      (stored) => {
        clearInterval(watch);
        resolve(stored);
      },
      (error: unknown) => {
        clearInterval(watch);
        reject(asError(error));
      },
    );
  });
}

function* slices(payload: Buffer): Generator<Buffer> {
  for (let offset = 0; offset < payload.length; offset += SLICE_BYTES) {
    yield payload.subarray(offset, offset + SLICE_BYTES);
  }
}

/** Hashes and counts the bytes passing through. */
class DigestingStream extends Transform {
  private readonly hash = sha256Hasher();
  private bytes = 0;

  /** The bytes the store has read so far. */
  get taken(): number {
    return this.bytes - this.readableLength;
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, done: TransformCallback): void {
    this.hash.update(chunk);
    this.bytes += chunk.length;
    done(null, chunk);
  }

  digest(): { sha256: string; bytes: number } {
    return { sha256: this.hash.digest('hex'), bytes: this.bytes };
  }
}
