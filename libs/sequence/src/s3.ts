/**
 * `nest-sequence/s3`: the S3-compatible payload store (peer: @aws-sdk/client-s3).
 *
 * @module nest-sequence/s3
 */
export { S3PayloadStore } from './adapters/payload/s3/s3.payload-store';
export type {
  S3ConnectOptions,
  S3PayloadStoreOptions,
} from './adapters/payload/s3/s3.payload-store.options';
export { S3PayloadTooLargeError } from './adapters/payload/s3/s3-payload-too-large.error';
export { S3MetadataTooLargeError } from './adapters/payload/s3/s3-metadata-too-large.error';
