import { SequenceError } from '../../../core/errors/sequence.error';

/**
 * A payload's metadata would not fit in S3's user metadata (2 KB per object, keys and values
 * counted in UTF-8): refused by `put` before it reads the payload or sends any request, rather
 * than by S3 once a part of the payload was uploaded.
 */
export class S3MetadataTooLargeError extends SequenceError {
  readonly code = 's3-metadata-too-large' as const;

  constructor(
    /** Bytes of user metadata the object would have: the store's fields and `metadata`. */
    readonly bytes: number,
    /** S3's limit: 2048. */
    readonly limit: number,
    /** Of `bytes`, what the caller's `metadata` takes, encoded (base64url JSON). */
    readonly metadataBytes: number,
  ) {
    super(
      `the payload's S3 user metadata would take ${bytes} bytes, over S3's limit of ${limit} ` +
        `bytes per object (the caller's metadata takes ${metadataBytes} of them, as base64url ` +
        "JSON; the content type and the store's own fields the rest): put less in metadata, " +
        'such as a reference to the data rather than the data itself',
    );
  }
}
