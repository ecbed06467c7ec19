import type { HeadObjectCommandOutput, S3Client } from '@aws-sdk/client-s3';
import { Readable } from 'node:stream';
import { abortReason } from '../../../core/async';
import { ClaimCheckNotFoundError } from '../../../core/errors/claim-check-not-found.error';
import { definedOnly } from '../../../core/objects';
import type {
  GetOptions,
  PayloadInfo,
  PayloadStore,
  PutOptions,
  StoredPayload,
  SweepCandidate,
  SweepQuery,
} from '../../../ports/payload-store.port';
import { SortedKeyCursor, listKeys } from './s3-key.cursor';
import { decodeObjectMetadata, encodeObjectMetadata } from './s3-object-metadata';
import { uploadObject } from './s3-object.upload';
import { S3PayloadKeys, S3_STORE_NAME, generateRef, parseRef } from './s3-payload-keys';
import { s3Sdk } from './s3-sdk';
import {
  resolveS3PayloadStoreOptions,
  S3_CONNECT_KEYS,
  type ResolvedS3PayloadStoreOptions,
  type S3ConnectOptions,
  type S3PayloadStoreOptions,
} from './s3.payload-store.options';
import { checkPutOptions } from '../put-options';
import { putFromSource } from '../put-source';

/**
 * {@link PayloadStore} on S3 or any S3-compatible service (MinIO, Ceph, R2, s3rver), through
 * `@aws-sdk/client-s3`.
 *
 * Keys, under the configured prefix (`nseq/` by default):
 *   payloads/<ref>    the bytes; user metadata `x-amz-meta-nseq-*` holds createdAt, expiresAt,
 *                     the content type and the caller's metadata
 *   published/<ref>   an empty object: the ticket of <ref> was published
 * A ref is `<createdAt>-<expiresAt>-<uuid>` (instants as 12 hex digits of epoch ms), generated
 * here and checked against that exact pattern before any request, so a ref from a message can
 * only ever name a key inside `payloads/` or `published/` of this prefix.
 *
 * Why `published` is a marker object: it is the only fact that changes after `put`, and S3
 * objects are immutable. Rewriting the metadata means a `CopyObject` of the payload onto itself,
 * which copies every byte server-side (slow for gigabytes, impossible in one request above
 * 5 GiB, a new version in versioned buckets). Object tags change in place, but not every
 * S3-compatible service has them (R2 does not) and a listing does not return them, so the
 * sweeper would need one `GetObjectTagging` per payload. A marker costs one small `PutObject`,
 * works everywhere, and is listable: together with the instants in the ref, two listings tell a
 * sweep everything, without a request per object. `markPublished` writes the marker before it
 * checks that the payload exists (and removes it when not), and `delete` removes the payload
 * before the marker, so that a delete racing a markPublished leaves no marker behind.
 * `put` of a published payload (a `checkIn`) writes the marker first, so that no sweep ever
 * lists the payload unmarked.
 *
 * The store never creates the bucket. A bucket lifecycle rule `AbortIncompleteMultipartUpload`
 * is advisable: it removes the parts of an upload whose abort failed (or whose process died).
 *
 * @example
 * const store = S3PayloadStore.connect({
 *   endpoint: 'http://127.0.0.1:9000', region: 'us-east-1', forcePathStyle: true,
 *   credentials: { accessKeyId: 'minio', secretAccessKey: 'minio123' }, bucket: 'payloads',
 * });
 */
export class S3PayloadStore implements PayloadStore {
  readonly name = S3_STORE_NAME;

  private readonly options: ResolvedS3PayloadStoreOptions;
  private readonly keys: S3PayloadKeys;
  private ownsClient = false;
  private closed = false;

  /** @param client used as it is; `close()` leaves it open (it is the caller's). */
  constructor(
    private readonly client: S3Client,
    options: S3PayloadStoreOptions,
  ) {
    this.options = resolveS3PayloadStoreOptions(options);
    this.keys = new S3PayloadKeys(this.options.prefix);
  }

  /** A store with an `S3Client` of its own, which `close()` destroys. Nothing is sent yet. */
  static connect(options: S3ConnectOptions): S3PayloadStore {
    const { endpoint, region, credentials, forcePathStyle, client, ...storeOptions } = options;
    // Fail on bad options (an unknown key among them) before making a client.
    resolveS3PayloadStoreOptions(storeOptions, S3_CONNECT_KEYS);
    const { S3Client: Client } = s3Sdk();
    const store = new S3PayloadStore(
      new Client({ ...client, ...definedOnly({ endpoint, region, credentials, forcePathStyle }) }),
      storeOptions,
    );
    store.ownsClient = true;
    return store;
  }

  /** See `uploadObject` for how the bytes travel and what a failure leaves. */
  put(payload: Buffer | Readable, options: PutOptions): Promise<StoredPayload> {
    return putFromSource(payload, () => this.putOnce(payload, options));
  }

  private async putOnce(payload: Buffer | Readable, options: PutOptions): Promise<StoredPayload> {
    // Before the marker: a content type S3 cannot carry as a header, or metadata over S3's 2 KB,
    // fails nothing half-way, and reads nothing of the payload.
    checkPutOptions(this.name, options);
    const metadata = encodeObjectMetadata(options);
    const ref = generateRef(options.now, options.expiresAt);
    const key = this.keys.payloadOf(ref);
    // A published payload's marker is written before its bytes: a sweep takes a listed payload
    // without a marker, created (at upload start) before the grace instant, for an orphan. Put
    // after the upload, the marker left a window in which a long upload's payload was listable
    // and unmarked, and a checkIn's payload could be swept under its new ticket.
    const markerKey = options.published ? this.keys.markerOf(ref) : undefined;
    if (markerKey) await this.putMarker(markerKey);
    try {
      const bytes = await uploadObject(
        {
          client: this.client,
          bucket: this.options.bucket,
          key,
          partBytes: this.options.partBytes,
          partsInFlight: this.options.partsInFlight,
          abortTimeoutMs: this.options.abortTimeoutMs,
          contentType: options.contentType,
          metadata,
        },
        payload,
      );
      return { ref, bytes };
    } catch (error) {
      // A put that rejects leaves nothing behind, its marker included (a marker left by a failed
      // delete here, or by a crash mid-upload, is an empty object that no sweep lists).
      if (markerKey) await this.deleteObject(markerKey).catch(() => undefined);
      throw error;
    }
  }

  /**
   * The object's body as S3 streams it; one `GetObject`, which stops waiting for S3's answer
   * once `signal` aborts (the request is destroyed; the rejection is the signal's reason).
   */
  async get(ref: string, { signal }: GetOptions = {}): Promise<Readable> {
    const { GetObjectCommand } = s3Sdk();
    const key = this.keys.payloadOf(ref);
    try {
      const { Body } = await this.client.send(
        new GetObjectCommand({ Bucket: this.options.bucket, Key: key }),
        { abortSignal: signal },
      );
      if (!(Body instanceof Readable)) {
        throw new TypeError(`S3 answered GetObject ${key} with a body that is not a Node stream`);
      }
      return Body;
    } catch (error) {
      if (signal?.aborted) throw abortReason(signal);
      if (isNotFound(error)) throw new ClaimCheckNotFoundError(this.name, ref);
      throw error;
    }
  }

  /** Two `HeadObject`s at once: the payload and its marker. */
  async head(ref: string): Promise<PayloadInfo | undefined> {
    const [object, marker] = await Promise.all([
      this.headObject(this.keys.payloadOf(ref)),
      this.headObject(this.keys.markerOf(ref)),
    ]);
    if (!object) {
      // HeadObject answers a missing bucket as it answers a missing key (a bare 404): asked of
      // the bucket, so that a misconfigured one fails as an outage rather than reading every
      // payload as gone (its tickets dead-lettered claim-check-not-found).
      await this.assertBucket();
      return undefined;
    }
    return {
      ref,
      bytes: object.ContentLength ?? 0,
      published: marker !== undefined,
      ...decodeObjectMetadata(object.Metadata, parseRef(ref)!, ref),
    };
  }

  /**
   * `HeadObject` (S3 does not say whether a `DeleteObject` removed anything), then a
   * `DeleteObject` of the payload and one of its marker. Concurrent deletes of one ref may both
   * answer `true`.
   */
  async delete(ref: string): Promise<boolean> {
    const payloadKey = this.keys.payloadOf(ref);
    const markerKey = this.keys.markerOf(ref);
    const existed = (await this.headObject(payloadKey)) !== undefined;
    if (existed) await this.deleteObject(payloadKey);
    // Also when the payload was gone: clears a marker that a crash between the two steps of
    // markPublished may have left.
    await this.deleteObject(markerKey);
    return existed;
  }

  /**
   * Not atomic: S3 cannot make the `DeleteObject` of the payload depend on its marker, another
   * object (`If-Match` compares the payload's own ETag, which `markPublished` leaves as it is).
   * Two `HeadObject`s at once, of the payload and its marker, then the `DeleteObject` of an
   * unmarked payload: a `markPublished` whose marker lands between the marker's `HeadObject` and
   * the delete (one request) answers `true` for a payload then deleted.
   */
  async deleteUnpublished(ref: string): Promise<boolean> {
    const payloadKey = this.keys.payloadOf(ref);
    const [object, marker] = await Promise.all([
      this.headObject(payloadKey),
      this.headObject(this.keys.markerOf(ref)),
    ]);
    if (!object || marker) return false;
    await this.deleteObject(payloadKey);
    return true;
  }

  /** `PutObject` of the marker, then `HeadObject` of the payload (and a `DeleteObject` if gone). */
  async markPublished(ref: string): Promise<boolean> {
    const payloadKey = this.keys.payloadOf(ref);
    const markerKey = this.keys.markerOf(ref);
    await this.putMarker(markerKey);
    if ((await this.headObject(payloadKey)) !== undefined) return true;
    await this.deleteObject(markerKey);
    return false;
  }

  /**
   * Lists `payloads/` in key order, which is creation order (ties in no particular order), so
   * candidates come oldest first. Expiry is read from each key; whether an unexpired payload past
   * the grace instant was published is answered by walking `published/` alongside (a merge join),
   * from the first such payload on.
   *
   * Cost: one `ListObjectsV2` per `listPageSize` payloads up to the point where `limit` candidates
   * were found (all of them when fewer), plus one per `listPageSize` markers of payloads created
   * at or before `unpublishedBefore`; no request per object.
   */
  async sweepCandidates(query: SweepQuery): Promise<SweepCandidate[]> {
    const candidates: SweepCandidate[] = [];
    if (!(query.limit >= 1)) return candidates;
    const listing = {
      client: this.client,
      bucket: this.options.bucket,
      pageSize: this.options.listPageSize,
    };
    let markers: SortedKeyCursor | undefined;
    try {
      for await (const key of listKeys({ ...listing, prefix: this.keys.payloads })) {
        const payload = this.keys.parsePayloadKey(key);
        if (!payload) continue; // not written by a store: left alone
        if (payload.expiresAt <= query.now) {
          candidates.push({ ref: payload.ref, reason: 'expired' });
        } else if (payload.createdAt <= query.unpublishedBefore) {
          const markerKey = this.keys.markerOf(payload.ref);
          // Starting just before the first marker that matters skips those of older payloads.
          markers ??= new SortedKeyCursor({
            ...listing,
            prefix: this.keys.published,
            startAfter: markerKey.slice(0, -1),
          });
          if (!(await markers.has(markerKey))) {
            candidates.push({ ref: payload.ref, reason: 'orphaned' });
          }
        }
        if (candidates.length >= query.limit) break;
      }
    } finally {
      await markers?.close();
    }
    return candidates;
  }

  /** `HeadBucket`: rejects when the service is unreachable, the bucket missing or forbidden. */
  async ping(): Promise<void> {
    const { HeadBucketCommand } = s3Sdk();
    await this.client.send(new HeadBucketCommand({ Bucket: this.options.bucket }));
  }

  /** Destroys the client when `connect` made it; a client passed in stays the caller's. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.ownsClient) this.client.destroy();
  }

  private async headObject(key: string): Promise<HeadObjectCommandOutput | undefined> {
    const { HeadObjectCommand } = s3Sdk();
    try {
      return await this.client.send(
        new HeadObjectCommand({ Bucket: this.options.bucket, Key: key }),
      );
    } catch (error) {
      if (isNotFound(error)) return undefined;
      throw error;
    }
  }

  /** Throws when the bucket does not exist (or cannot be reached). */
  private async assertBucket(): Promise<void> {
    const { HeadBucketCommand } = s3Sdk();
    const { bucket } = this.options;
    try {
      await this.client.send(new HeadBucketCommand({ Bucket: bucket }));
    } catch (error) {
      if (!isNotFound(error)) throw error;
      throw new Error(`the S3 bucket ${bucket} does not exist`, { cause: error });
    }
  }

  private async putMarker(key: string): Promise<void> {
    const { PutObjectCommand } = s3Sdk();
    await this.client.send(
      new PutObjectCommand({
        Bucket: this.options.bucket,
        Key: key,
        Body: Buffer.alloc(0),
        ContentLength: 0,
      }),
    );
  }

  private async deleteObject(key: string): Promise<void> {
    const { DeleteObjectCommand } = s3Sdk();
    await this.client.send(new DeleteObjectCommand({ Bucket: this.options.bucket, Key: key }));
  }
}

/**
 * A missing object: `NoSuchKey` from GetObject, a bare 404 (`NotFound`) from HeadObject, which
 * has no body to say more. A missing bucket is a misconfiguration, not a missing payload.
 */
function isNotFound(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  if (error.name === 'NoSuchKey' || error.name === 'NotFound') return true;
  const status = (error as { $metadata?: { httpStatusCode?: number } }).$metadata?.httpStatusCode;
  return status === 404 && error.name !== 'NoSuchBucket';
}
