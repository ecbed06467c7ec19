import { SequenceError } from './sequence.error';

/**
 * A ticket's claim could no longer be shown to be held while its handler ran: a renewal found
 * it taken, or none answered for most of `tuning.leaseMs`, so the lease may have lapsed and
 * another delivery of the ticket may take it over. The running handler call is abandoned (its
 * `AbortSignal` aborted with this error), no completion is recorded for it, and the message is
 * requeued as for a ledger outage.
 */
export class ClaimLeaseLostError extends SequenceError {
  readonly code = 'claim-lease-lost' as const;

  constructor(
    readonly ledger: string,
    readonly ticket: string,
    readonly group: string,
    /** Why: `taken` (a renewal found another holder or a completion), `unconfirmed`. */
    readonly why: 'taken' | 'unconfirmed',
    readonly leaseMs: number,
  ) {
    super(
      `the claim on ${JSON.stringify(ticket)} for ${group} in the ${ledger} claim ledger ` +
        (why === 'taken'
          ? 'was found taken by a renewal'
          : `was not renewed in time to be sure it was still held (tuning.leaseMs ${leaseMs} ms)`) +
        '; the handler was asked to stop through its AbortSignal',
    );
  }
}
