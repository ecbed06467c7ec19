import { SequenceError } from './sequence.error';

/** The bytes read for a ticket differ from the SHA-256 or byte count the ticket was signed with. */
export class ClaimCheckIntegrityError extends SequenceError {
  readonly code = 'integrity-mismatch' as const;

  constructor(
    readonly store: string,
    readonly ref: string,
    readonly expected: { readonly sha256: string; readonly bytes: number },
    readonly actual: { readonly sha256: string; readonly bytes: number },
  ) {
    super(
      `claim check ${store}:${ref}: read ${actual.bytes} bytes with sha256 ${actual.sha256}, ` +
        `the ticket says ${expected.bytes} bytes with sha256 ${expected.sha256}`,
    );
  }
}
