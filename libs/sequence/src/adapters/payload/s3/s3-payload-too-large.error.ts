import { SequenceError } from '../../../core/errors/sequence.error';

/** A payload needs more than S3's 10,000 parts of `partBytes`. */
export class S3PayloadTooLargeError extends SequenceError {
  readonly code = 's3-payload-too-large' as const;

  constructor(
    readonly key: string,
    readonly partBytes: number,
    readonly maxParts: number,
  ) {
    super(
      `the payload for ${key} exceeds ${maxParts} parts of ${partBytes} bytes, the most one S3 ` +
        'object can have; raise partBytes (up to 5 GiB) to store larger payloads',
    );
  }
}
