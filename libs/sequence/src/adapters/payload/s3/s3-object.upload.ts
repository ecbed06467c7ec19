import type { S3Client } from '@aws-sdk/client-s3';
import type { Readable } from 'node:stream';
import { unlessAborted } from '../../../core/async';
import { byteChunk } from '../../../core/payload-source';
import { s3Sdk } from './s3-sdk';
import { S3_MAX_PARTS } from './s3.payload-store.options';
import { S3PayloadTooLargeError } from './s3-payload-too-large.error';

/** Where and how one object is uploaded. */
export interface UploadTarget {
  readonly client: S3Client;
  readonly bucket: string;
  readonly key: string;
  readonly partBytes: number;
  readonly partsInFlight: number;
  /** How long a failed multipart upload waits for its parts to stop and its abort. */
  readonly abortTimeoutMs: number;
  readonly contentType?: string;
  readonly metadata: Record<string, string>;
}

/**
 * Writes `payload` to one object and resolves its byte count. Up to `partBytes` it is one
 * `PutObject`; beyond that a multipart upload, part by part as the source produces them, with at
 * most `partsInFlight` parts uploading and one filling: the source is read no faster than S3
 * takes it. The object appears only when everything went well (S3 shows a multipart object only
 * once completed). When the source or S3 fails, the parts still uploading are cancelled, the
 * upload is aborted, and the promise rejects with that failure; should the abort itself fail, or
 * not be done within `abortTimeoutMs` (an S3 that stopped answering), the parts stay until a
 * bucket lifecycle rule (`AbortIncompleteMultipartUpload`) removes them, and the original failure
 * is still what rejects. A source destroyed by its owner before its end (a publish whose signal
 * aborted) cancels the requests in flight at once: the upload may be waiting on S3 rather than
 * reading the source, and would otherwise notice only once S3 answered.
 */
export async function uploadObject(
  target: UploadTarget,
  payload: Buffer | Readable,
): Promise<number> {
  if (Buffer.isBuffer(payload) && payload.length <= target.partBytes) {
    await putWhole(target, payload);
    return payload.length;
  }
  const source: Iterable<Buffer> | AsyncIterable<unknown> = Buffer.isBuffer(payload)
    ? slices(payload, target.partBytes)
    : payload;
  const cancel = new AbortController();
  const onSourceClosed = () => {
    if (Buffer.isBuffer(payload) || payload.readableEnded) return;
    cancel.abort(payload.errored ?? new Error('the payload stream was closed before its end'));
  };
  if (!Buffer.isBuffer(payload)) payload.once('close', onSourceClosed);
  const pending: Buffer[] = [];
  let pendingBytes = 0;
  let total = 0;
  let upload: MultipartUpload | undefined;
  try {
    for await (const chunk of source) {
      const bytes = byteChunk(chunk);
      total += bytes.length;
      pending.push(bytes);
      pendingBytes += bytes.length;
      // Strictly more than a part: a payload of exactly partBytes stays a single PutObject.
      while (pendingBytes > target.partBytes) {
        upload ??= await MultipartUpload.begin(target, cancel.signal);
        await upload.send(takeBytes(pending, target.partBytes));
        pendingBytes -= target.partBytes;
      }
    }
    const rest = takeBytes(pending, pendingBytes);
    if (!upload) {
      await putWhole(target, rest, cancel.signal);
    } else {
      if (rest.length > 0) await upload.send(rest);
      await upload.complete();
    }
    return total;
  } catch (error) {
    await upload?.abort();
    // A request cancelled with the source fails with the SDK's AbortError: the source's says why.
    throw cancel.signal.aborted && isAbortError(error) ? cancel.signal.reason : error;
  } finally {
    if (!Buffer.isBuffer(payload)) payload.off('close', onSourceClosed);
  }
}

function isAbortError(error: unknown): boolean {
  return error instanceof Error && error.name === 'AbortError';
}

async function putWhole(target: UploadTarget, body: Buffer, signal?: AbortSignal): Promise<void> {
  const { PutObjectCommand } = s3Sdk();
  await target.client.send(
    new PutObjectCommand({
      Bucket: target.bucket,
      Key: target.key,
      Body: body,
      ContentLength: body.length,
      ContentType: target.contentType,
      Metadata: target.metadata,
    }),
    { abortSignal: signal },
  );
}

/** One multipart upload: parts sent in order, at most `partsInFlight` at a time. */
class MultipartUpload {
  private readonly parts: { PartNumber: number; ETag: string }[] = [];
  private readonly inFlight = new Set<Promise<void>>();
  private failure: { readonly error: unknown } | undefined;
  private partNumber = 0;
  /** Aborted to cancel the parts still uploading: by `abort()`, or when `cancel` aborts. */
  private readonly requests = new AbortController();
  private readonly partSignal: AbortSignal;

  private constructor(
    private readonly target: UploadTarget,
    private readonly uploadId: string,
    cancel: AbortSignal,
  ) {
    this.partSignal = AbortSignal.any([cancel, this.requests.signal]);
  }

  /** Starts the upload; `cancel` aborts its requests (this one and its parts'). */
  static async begin(target: UploadTarget, cancel: AbortSignal): Promise<MultipartUpload> {
    const { CreateMultipartUploadCommand } = s3Sdk();
    const { UploadId } = await target.client.send(
      new CreateMultipartUploadCommand({
        Bucket: target.bucket,
        Key: target.key,
        ContentType: target.contentType,
        Metadata: target.metadata,
      }),
      { abortSignal: cancel },
    );
    if (!UploadId)
      throw new Error(`S3 started no multipart upload for ${target.key} (no UploadId)`);
    return new MultipartUpload(target, UploadId, cancel);
  }

  /** Starts uploading `body` as the next part, once fewer than `partsInFlight` are uploading. */
  async send(body: Buffer): Promise<void> {
    while (this.inFlight.size >= this.target.partsInFlight) await Promise.race(this.inFlight);
    this.throwIfFailed();
    const partNumber = ++this.partNumber;
    if (partNumber > S3_MAX_PARTS) {
      throw new S3PayloadTooLargeError(this.target.key, this.target.partBytes, S3_MAX_PARTS);
    }
    const { UploadPartCommand } = s3Sdk();
    const part: Promise<void> = this.target.client
      .send(
        new UploadPartCommand({
          Bucket: this.target.bucket,
          Key: this.target.key,
          UploadId: this.uploadId,
          PartNumber: partNumber,
          Body: body,
          ContentLength: body.length,
        }),
        { abortSignal: this.partSignal },
      )
      .then(({ ETag }) => {
        if (!ETag)
          throw new Error(`S3 answered part ${partNumber} of ${this.target.key} without an ETag`);
        this.parts.push({ PartNumber: partNumber, ETag });
      })
      // Kept, not thrown: the next send() or complete() reports it, and abort() can wait for all.
      .catch((error: unknown) => {
        this.failure ??= { error };
      })
      .finally(() => this.inFlight.delete(part));
    this.inFlight.add(part);
  }

  async complete(): Promise<void> {
    await Promise.all(this.inFlight);
    this.throwIfFailed();
    const { CompleteMultipartUploadCommand } = s3Sdk();
    await this.target.client.send(
      new CompleteMultipartUploadCommand({
        Bucket: this.target.bucket,
        Key: this.target.key,
        UploadId: this.uploadId,
        MultipartUpload: { Parts: [...this.parts].sort((a, b) => a.PartNumber - b.PartNumber) },
      }),
    );
  }

  /**
   * Cancels the parts still uploading and drops those uploaded, waiting at most `abortTimeoutMs`
   * for both (then the request is cancelled too). Never rejects: the caller reports the failure
   * that led here instead.
   */
  async abort(): Promise<void> {
    const { key, abortTimeoutMs } = this.target;
    this.requests.abort(new Error(`the multipart upload of ${key} failed`));
    const deadline = new AbortController();
    const timer = setTimeout(
      () =>
        deadline.abort(
          new Error(`S3 did not abort the upload of ${key} within ${abortTimeoutMs} ms`),
        ),
      abortTimeoutMs,
    );
    try {
      // Cancelled parts settle at once; waited for, as a part that still landed after the abort
      // would be kept (and billed).
      await unlessAborted(Promise.all(this.inFlight), deadline.signal);
      const { AbortMultipartUploadCommand } = s3Sdk();
      await this.target.client.send(
        new AbortMultipartUploadCommand({
          Bucket: this.target.bucket,
          Key: key,
          UploadId: this.uploadId,
        }),
        { abortSignal: deadline.signal },
      );
    } catch {
      // Left to the bucket's lifecycle rule.
    } finally {
      clearTimeout(timer);
    }
  }

  private throwIfFailed(): void {
    if (this.failure) throw this.failure.error;
  }
}

/** `payload` in views of `size` bytes (no copies), as a stream of chunks would come. */
function* slices(payload: Buffer, size: number): Generator<Buffer> {
  for (let offset = 0; offset < payload.length; offset += size) {
    yield payload.subarray(offset, offset + size);
  }
}

/** Removes the first `count` bytes from `chunks` (which hold at least that many) as one Buffer. */
function takeBytes(chunks: Buffer[], count: number): Buffer {
  const taken: Buffer[] = [];
  let missing = count;
  while (missing > 0) {
    const head = chunks[0];
    if (head.length <= missing) {
      taken.push(head);
      chunks.shift();
      missing -= head.length;
    } else {
      taken.push(head.subarray(0, missing));
      chunks[0] = head.subarray(missing);
      missing = 0;
    }
  }
  return taken.length === 1 ? taken[0] : Buffer.concat(taken, count);
}
