import { errorMessage } from '../../../core/errors/caught';
import { PayloadMetadataCorruptError } from '../../../core/errors/payload-metadata-corrupt.error';
import type { PutOptions } from '../../../ports/payload-store.port';
import { decodeUserMetadata } from '../stored-metadata';
import { S3_STORE_NAME } from './s3-payload-keys';
import { S3MetadataTooLargeError } from './s3-metadata-too-large.error';

/**
 * How a payload's metadata travels as S3 user metadata (`x-amz-meta-*`). S3 keeps those headers
 * ASCII and lowercases their names, so free text is encoded: the content type with
 * `encodeURIComponent`, the caller's pairs as base64url JSON (any keys, any case, any Unicode).
 * S3 allows 2 KB of user metadata per object: more is refused here, before anything is sent,
 * where S3 would refuse it only once the first part of the payload was uploaded.
 */
const CREATED_AT = 'nseq-created-at';
const EXPIRES_AT = 'nseq-expires-at';
const CONTENT_TYPE = 'nseq-content-type';
const USER_METADATA = 'nseq-metadata';

export interface DecodedMetadata {
  readonly createdAt: number;
  readonly expiresAt: number;
  readonly contentType?: string;
  readonly metadata?: Readonly<Record<string, string>>;
}

/**
 * S3's limit on an object's user metadata, in bytes: the sum of each key's and value's UTF-8
 * length (without the `x-amz-meta-` prefix).
 */
export const S3_USER_METADATA_LIMIT = 2048;

/** @throws S3MetadataTooLargeError when it would not fit in {@link S3_USER_METADATA_LIMIT} */
export function encodeObjectMetadata(options: PutOptions): Record<string, string> {
  const encoded: Record<string, string> = {
    [CREATED_AT]: String(options.now),
    [EXPIRES_AT]: String(options.expiresAt),
  };
  if (options.contentType !== undefined) {
    encoded[CONTENT_TYPE] = encodeURIComponent(options.contentType);
  }
  if (options.metadata && Object.keys(options.metadata).length > 0) {
    encoded[USER_METADATA] = Buffer.from(JSON.stringify(options.metadata)).toString('base64url');
  }
  const bytes = Object.entries(encoded).reduce(
    (sum, [key, value]) => sum + Buffer.byteLength(key) + Buffer.byteLength(value),
    0,
  );
  if (bytes > S3_USER_METADATA_LIMIT) {
    const user = encoded[USER_METADATA];
    const metadataBytes = user === undefined ? 0 : USER_METADATA.length + user.length;
    throw new S3MetadataTooLargeError(bytes, S3_USER_METADATA_LIMIT, metadataBytes);
  }
  return encoded;
}

/**
 * The metadata `encodeObjectMetadata` wrote. `fallback` (the instants in the ref) stands in for
 * instants that are missing, which happens only to objects written under the prefix by others.
 */
export function decodeObjectMetadata(
  stored: Readonly<Record<string, string>> | undefined,
  fallback: { readonly createdAt: number; readonly expiresAt: number },
  /** The object's ref, for the error when the metadata cannot be read. */
  ref: string,
): DecodedMetadata {
  const createdAt = Number(stored?.[CREATED_AT] ?? NaN);
  const expiresAt = Number(stored?.[EXPIRES_AT] ?? NaN);
  const contentType = stored?.[CONTENT_TYPE];
  const metadata = stored?.[USER_METADATA];
  return {
    createdAt: Number.isFinite(createdAt) ? createdAt : fallback.createdAt,
    expiresAt: Number.isNaN(expiresAt) ? fallback.expiresAt : expiresAt,
    ...(contentType !== undefined && { contentType: decodeContentType(contentType, ref) }),
    ...(metadata !== undefined && {
      metadata: decodeUserMetadata(
        S3_STORE_NAME,
        ref,
        Buffer.from(metadata, 'base64url').toString('utf8'),
      ),
    }),
  };
}

function decodeContentType(encoded: string, ref: string): string {
  try {
    return decodeURIComponent(encoded);
  } catch (error) {
    throw new PayloadMetadataCorruptError(S3_STORE_NAME, ref, errorMessage(error));
  }
}
