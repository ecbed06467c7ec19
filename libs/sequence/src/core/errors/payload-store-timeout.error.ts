import { SequenceError } from './sequence.error';

/**
 * A payload store call besides `put` and the reads: a consumer's, a publish's, a release's or the
 * orphan sweeper's.
 */
export type PayloadStoreCall = 'markPublished' | 'delete' | 'sweepCandidates';

/**
 * A payload store did not answer a `markPublished` or a `delete` within
 * `claimCheck.readTimeoutMs`. The call was abandoned (it may still land), and treated as one that
 * failed. A consumer's: the mark (of a payload its sender left unmarked) is tried again after the
 * handler, the delete (of a payload its consumers are done with, or of a parked fragment body)
 * left to the sweeper or the payload's expiry; the message is not held for it. A publish's: the
 * mark after its ticket's confirm is tried again in the background, the delete after a failed
 * publish left to the orphan sweeper; the publish is not held for it. Thrown to the caller only
 * by a publish whose slow upload could not be marked before its ticket went out (no ticket was
 * published), and by `ClaimCheckService.release`. The orphan sweeper's: a listing or a delete
 * it gave up on is left to its next run, and the other stores are swept meanwhile.
 */
export class PayloadStoreTimeoutError extends SequenceError {
  readonly code = 'payload-store-timeout' as const;

  constructor(
    readonly store: string,
    /** The payload's ref; empty for a listing (`sweepCandidates`). */
    readonly ref: string,
    readonly call: PayloadStoreCall,
    readonly timeoutMs: number,
  ) {
    super(
      `the ${store} payload store did not answer ${call}` +
        `${ref === '' ? '' : ` of ${JSON.stringify(ref)}`} within ` +
        `${timeoutMs} ms (claimCheck.readTimeoutMs); the call was abandoned`,
    );
  }
}
