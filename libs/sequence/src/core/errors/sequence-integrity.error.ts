import { SequenceError } from './sequence.error';

/** The reassembled payload does not match the SHA-256 or byte count its producer declared. */
export class SequenceIntegrityError extends SequenceError {
  readonly code = 'integrity-mismatch' as const;

  constructor(
    readonly sequenceId: string,
    readonly expected: { sha256?: string; bytes?: number },
    readonly actual: { sha256: string; bytes: number },
  ) {
    super(
      `sequence ${sequenceId}: reassembled ${actual.bytes} bytes with sha256 ${actual.sha256}, ` +
        `producer declared ${expected.bytes ?? '?'} bytes with sha256 ${expected.sha256 ?? '?'}`,
    );
  }
}
