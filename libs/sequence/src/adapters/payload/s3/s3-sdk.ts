import type * as S3 from '@aws-sdk/client-s3';

let loaded: typeof S3 | undefined;

/**
 * `@aws-sdk/client-s3`, loaded on first use rather than at the top of a file: it is an optional
 * peer of the library, needed only by applications that use the S3 payload store.
 */
export function s3Sdk(): typeof S3 {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  loaded ??= require('@aws-sdk/client-s3') as typeof S3;
  return loaded;
}
