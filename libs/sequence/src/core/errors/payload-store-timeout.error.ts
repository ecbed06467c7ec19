import { SequenceError } from './sequence.error';

/** A payload store call besides `put` and the reads: a consumer's, a publish's or a release's. */
export type PayloadStoreCall = 'markPublished' | 'delete';

/**
 * A payload store did not answer a `markPublished` or a `delete` within
 * `claimCheck.readTimeoutMs`. The call was abandoned (it may still land), and treated as one that
 * failed. A consumer's: the mark (of a payload its sender left unmarked) is tried again after the
 * handler, the delete (of a payload its consumers are done with, or of a parked fragment body)
 * left to the sweeper or the payload's expiry; the message is not held for it. A publish's: the
 * mark after its ticket's confirm is tried again in the background, the delete after a failed
 * publish left to the orphan sweeper; the publish is not held for it. Thrown to the caller only
 * by a publish whose slow upload could not be marked before its ticket went out (no ticket was
 * published), and by `ClaimCheckService.release`.
 */
export class PayloadStoreTimeoutError extends SequenceError {
  readonly code = 'payload-store-timeout' as const;

  constructor(
    readonly store: string,
    readonly ref: string,
    readonly call: PayloadStoreCall,
    readonly timeoutMs: number,
  ) {
    super(
      `the ${store} payload store did not answer ${call} of ${JSON.stringify(ref)} within ` +
        `${timeoutMs} ms (claimCheck.readTimeoutMs); the call was abandoned`,
    );
  }
}
