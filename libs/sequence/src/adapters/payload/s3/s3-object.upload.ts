import type { S3Client } from '@aws-sdk/client-s3';
import type { Readable } from 'node:stream';
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
  readonly contentType?: string;
  readonly metadata: Record<string, string>;
}

/**
 * Writes `payload` to one object and resolves its byte count. Up to `partBytes` it is one
 * `PutObject`; beyond that a multipart upload, part by part as the source produces them, with at
 * most `partsInFlight` parts uploading and one filling: the source is read no faster than S3
 * takes it. The object appears only when everything went well (S3 shows a multipart object only
 * once completed). When the source or S3 fails, the upload is aborted and the promise rejects
 * with that failure; should the abort itself fail, the parts stay until a bucket lifecycle rule
 * (`AbortIncompleteMultipartUpload`) removes them, and the original failure is still what rejects.
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
        upload ??= await MultipartUpload.begin(target);
        await upload.send(takeBytes(pending, target.partBytes));
        pendingBytes -= target.partBytes;
      }
    }
    const rest = takeBytes(pending, pendingBytes);
    if (!upload) {
      await putWhole(target, rest);
    } else {
      if (rest.length > 0) await upload.send(rest);
      await upload.complete();
    }
    return total;
  } catch (error) {
    await upload?.abort();
    throw error;
  }
}

async function putWhole(target: UploadTarget, body: Buffer): Promise<void> {
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
  );
}

/** One multipart upload: parts sent in order, at most `partsInFlight` at a time. */
class MultipartUpload {
  private readonly parts: { PartNumber: number; ETag: string }[] = [];
  private readonly inFlight = new Set<Promise<void>>();
  private failure: { readonly error: unknown } | undefined;
  private partNumber = 0;

  private constructor(
    private readonly target: UploadTarget,
    private readonly uploadId: string,
  ) {}

  static async begin(target: UploadTarget): Promise<MultipartUpload> {
    const { CreateMultipartUploadCommand } = s3Sdk();
    const { UploadId } = await target.client.send(
      new CreateMultipartUploadCommand({
        Bucket: target.bucket,
        Key: target.key,
        ContentType: target.contentType,
        Metadata: target.metadata,
      }),
    );
    if (!UploadId)
      throw new Error(`S3 started no multipart upload for ${target.key} (no UploadId)`);
    return new MultipartUpload(target, UploadId);
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

  /** Drops the parts. Never rejects: the caller reports the failure that led here instead. */
  async abort(): Promise<void> {
    // Parts still uploading could otherwise land after the abort and be kept (and billed).
    await Promise.all(this.inFlight);
    const { AbortMultipartUploadCommand } = s3Sdk();
    await this.target.client
      .send(
        new AbortMultipartUploadCommand({
          Bucket: this.target.bucket,
          Key: this.target.key,
          UploadId: this.uploadId,
        }),
      )
      .catch(() => undefined);
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
