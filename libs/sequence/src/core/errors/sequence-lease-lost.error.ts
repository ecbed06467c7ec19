import { SequenceError } from './sequence.error';

/**
 * A complete sequence's completion lease could no longer be shown to be held while its handler
 * ran: a renewal found it taken, or none answered for most of `tuning.leaseMs`, so the lease may
 * have lapsed and a redelivered fragment may take the sequence over. The running handler call is
 * abandoned (its `AbortSignal` aborted with this error), no outcome is recorded for it, and the
 * fragment is requeued as for a store outage.
 */
export class SequenceLeaseLostError extends SequenceError {
  readonly code = 'sequence-lease-lost' as const;

  constructor(
    readonly store: string,
    readonly channel: string,
    readonly sequenceId: string,
    /** Why: `taken` (a renewal found another holder or a verdict), `unconfirmed`. */
    readonly why: 'taken' | 'unconfirmed',
    readonly leaseMs: number,
  ) {
    super(
      `the completion lease of sequence ${JSON.stringify(sequenceId)} on ${channel} in the ` +
        `${store} store ` +
        (why === 'taken'
          ? 'was found taken by a renewal'
          : `was not renewed in time to be sure it was still held (tuning.leaseMs ${leaseMs} ms)`) +
        '; its handler, if running, is asked to stop through its AbortSignal',
    );
  }
}
