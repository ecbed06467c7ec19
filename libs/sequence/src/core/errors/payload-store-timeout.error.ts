import { SequenceError } from './sequence.error';

/**
 * A payload store call besides the reads: a publish's upload, a consumer's, a publish's, a
 * release's or the orphan sweeper's.
 */
export type PayloadStoreCall = 'put' | 'markPublished' | 'delete' | 'sweepCandidates';

/**
 * A payload store did not answer a `markPublished` or a `delete` within
 * `claimCheck.readTimeoutMs`, or held a `put` up for `claimCheck.writeTimeoutMs` (it took none of
 * the bytes waiting for it, or did not answer once it had them all). The call was abandoned (it
 * may still land), and treated as one that failed.
 *
 * - A put's is thrown to the caller (a publish, `checkIn`, a send `via: 'claim-check'`): the
 *   source stream is destroyed, no ticket is published, and a payload stored all the same is
 *   deleted (no ticket names it).
 * - A consumer's: the mark (of a payload its sender left unmarked) is tried again after the
 *   handler, the delete (of a payload its consumers are done with, or of a parked fragment body)
 *   left to the sweeper or the payload's expiry; the message is not held for it.
 * - A publish's: the mark after its ticket's confirm is tried again in the background, the
 *   delete after a failed publish left to the orphan sweeper; the publish is not held for it. A
 *   publish whose slow upload could not be marked before its ticket went out throws it (no
 *   ticket was published), and so does `ClaimCheckService.release`.
 * - The orphan sweeper's: a listing or a delete it gave up on is left to its next run, and the
 *   other stores are swept meanwhile.
 */
export class PayloadStoreTimeoutError extends SequenceError {
  readonly code = 'payload-store-timeout' as const;

  constructor(
    readonly store: string,
    /** The payload's ref; empty for a listing (`sweepCandidates`) or a put. */
    readonly ref: string,
    readonly call: PayloadStoreCall,
    readonly timeoutMs: number,
  ) {
    super(
      call === 'put'
        ? `the ${store} payload store held an upload up for ${timeoutMs} ms ` +
            '(claimCheck.writeTimeoutMs): it took no more of it, or did not answer once it had ' +
            'it all; the put was abandoned'
        : `the ${store} payload store did not answer ${call}` +
            `${ref === '' ? '' : ` of ${JSON.stringify(ref)}`} within ` +
            `${timeoutMs} ms (claimCheck.readTimeoutMs); the call was abandoned`,
    );
  }
}
