import type { S3ClientConfig } from '@aws-sdk/client-s3';
import { MAX_TIMER_MS } from '../../../core/async';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import { definedOnly } from '../../../core/objects';
import { checkOptionKeys, type OptionKeysOf } from '../../../core/option-keys';

const MIB = 1024 * 1024;

/** S3's limits on multipart uploads: parts of 5 MiB to 5 GiB (the last may be smaller). */
export const S3_MIN_PART_BYTES = 5 * MIB;
export const S3_MAX_PART_BYTES = 5 * 1024 * MIB;
export const S3_MAX_PARTS = 10_000;

/** Options of {@link S3PayloadStore}. */
export interface S3PayloadStoreOptions {
  /** The bucket that holds the payloads. It must exist: the store never creates buckets. */
  readonly bucket: string;
  /**
   * Key prefix of everything the store writes, so that several stores (or applications) can share
   * a bucket. Empty, or folder-like segments each ending in `/`, of the characters S3 calls safe
   * (`A-Z a-z 0-9 ! - _ . * ' ( )`), with no `.` or `..` segment.
   * @default 'nseq/'
   */
  readonly prefix?: string;
  /**
   * Size of each part of a multipart upload, and the largest payload sent as one `PutObject`.
   * From 5 MiB to 5 GiB (S3's limits). A payload can have at most 10,000 parts, so this also caps
   * the payload size: 8 MiB parts allow payloads up to 78 GiB.
   * @default 8388608 (8 MiB)
   */
  readonly partBytes?: number;
  /**
   * Parts uploading at the same time. A `put` holds at most `partBytes × (partsInFlight + 1)`
   * bytes of the payload in memory: the parts in flight and the one being filled.
   * @default 2
   */
  readonly partsInFlight?: number;
  /**
   * Keys asked for per `ListObjectsV2` request when sweeping (S3 returns at most 1,000).
   * @default 1000
   */
  readonly listPageSize?: number;
  /**
   * How long a failed multipart upload waits for S3 to drop its parts: for its parts still
   * uploading to stop (they are cancelled at once), then for the `AbortMultipartUpload`. Past it,
   * the request is cancelled, `put` rejects with the failure that led there, and the parts are
   * left to a bucket lifecycle rule (`AbortIncompleteMultipartUpload`). A failed `put` never
   * waits on an S3 that stopped answering for longer than this.
   * @default 30000
   */
  readonly abortTimeoutMs?: number;
}

const S3_PAYLOAD_STORE_KEYS = {
  bucket: true,
  prefix: true,
  partBytes: true,
  partsInFlight: true,
  listPageSize: true,
  abortTimeoutMs: true,
} as const satisfies OptionKeysOf<S3PayloadStoreOptions>;

/** Options of {@link S3PayloadStore.connect}: the store's options and the client's. */
export interface S3ConnectOptions extends S3PayloadStoreOptions {
  /** For S3-compatible services, e.g. `http://127.0.0.1:9000`. Absent for AWS itself. */
  readonly endpoint?: string;
  /** When absent, the SDK resolves it (`AWS_REGION`, shared config files). */
  readonly region?: string;
  /** When absent, the SDK's default provider chain (environment, shared files, instance role). */
  readonly credentials?: S3ClientConfig['credentials'];
  /**
   * `http://host/bucket/key` rather than `http://bucket.host/key`; most S3-compatible services
   * (MinIO, Ceph, s3rver) need it.
   * @default false
   */
  readonly forcePathStyle?: boolean;
  /**
   * Further client settings, e.g. `maxAttempts`, `requestHandler`, or
   * `requestChecksumCalculation: 'WHEN_REQUIRED'` for services that refuse the SDK's default
   * CRC32 checksum headers.
   */
  readonly client?: Omit<S3ClientConfig, 'endpoint' | 'region' | 'credentials' | 'forcePathStyle'>;
}

export const S3_CONNECT_KEYS = {
  ...S3_PAYLOAD_STORE_KEYS,
  endpoint: true,
  region: true,
  credentials: true,
  forcePathStyle: true,
  client: true,
} as const satisfies OptionKeysOf<S3ConnectOptions>;

export type ResolvedS3PayloadStoreOptions = Required<S3PayloadStoreOptions>;

export const S3_PAYLOAD_STORE_DEFAULTS = {
  prefix: 'nseq/',
  partBytes: 8 * MIB,
  partsInFlight: 2,
  listPageSize: 1_000,
  abortTimeoutMs: 30_000,
} as const;

/** Most parts a store keeps in flight: each one is `partBytes` of memory. */
const MAX_PARTS_IN_FLIGHT = 16;

const PREFIX_PATTERN = /^(?:[A-Za-z0-9!_.*'()-]+\/)*$/;

/** Fills in defaults; throws `SequenceOptionsError` listing every invalid option. */
export function resolveS3PayloadStoreOptions(
  options: S3PayloadStoreOptions,
  keys: object = S3_PAYLOAD_STORE_KEYS,
): ResolvedS3PayloadStoreOptions {
  const resolved = {
    ...S3_PAYLOAD_STORE_DEFAULTS,
    ...definedOnly(options),
    bucket: options.bucket,
  };
  const problems: string[] = [];
  checkOptionKeys(problems, options, keys);
  if (typeof resolved.bucket !== 'string' || resolved.bucket.length === 0) {
    problems.push('bucket must name an existing bucket');
  }
  if (!isSafePrefix(resolved.prefix)) {
    problems.push(
      `prefix must be empty or segments ending in '/' (such as 'nseq/' or 'apps/imaging/') of ` +
        `A-Z a-z 0-9 ! - _ . * ' ( ), without '.' or '..' segments; got ${JSON.stringify(resolved.prefix)}`,
    );
  }
  if (!isIntegerIn(resolved.partBytes, S3_MIN_PART_BYTES, S3_MAX_PART_BYTES)) {
    problems.push(
      `partBytes must be an integer from ${S3_MIN_PART_BYTES} (5 MiB) to ${S3_MAX_PART_BYTES} ` +
        `(5 GiB), S3's limits for a part; got ${String(resolved.partBytes)}`,
    );
  }
  if (!isIntegerIn(resolved.partsInFlight, 1, MAX_PARTS_IN_FLIGHT)) {
    problems.push(
      `partsInFlight must be an integer from 1 to ${MAX_PARTS_IN_FLIGHT}; got ${String(resolved.partsInFlight)}`,
    );
  }
  if (!isIntegerIn(resolved.listPageSize, 1, 1_000)) {
    problems.push(
      `listPageSize must be an integer from 1 to 1000; got ${String(resolved.listPageSize)}`,
    );
  }
  if (!isIntegerIn(resolved.abortTimeoutMs, 1, MAX_TIMER_MS)) {
    problems.push(
      `abortTimeoutMs must be an integer from 1 to ${MAX_TIMER_MS}; got ${String(resolved.abortTimeoutMs)}`,
    );
  }
  if (problems.length > 0) throw new SequenceOptionsError('S3PayloadStore options', problems);
  return resolved;
}

function isSafePrefix(prefix: unknown): prefix is string {
  if (typeof prefix !== 'string' || prefix.length > 512 || !PREFIX_PATTERN.test(prefix)) {
    return false;
  }
  return prefix.split('/').every((segment) => segment !== '.' && segment !== '..');
}

function isIntegerIn(value: unknown, min: number, max: number): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= min && value <= max;
}
