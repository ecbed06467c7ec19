import { SequenceError } from './sequence.error';

/** A payload store call a consumer makes besides reading the payload. */
export type PayloadStoreCall = 'markPublished' | 'delete';

/**
 * A payload store did not answer a consumer's `markPublished` (of a payload its sender left
 * unmarked) or its `delete` (of a payload its consumers are done with) within
 * `claimCheck.readTimeoutMs`. The call was abandoned, and treated as one that failed: the mark
 * is tried again after the handler, the delete left to the orphan sweeper at the payload's
 * expiry. The message is not held for it.
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
