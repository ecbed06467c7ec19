import { SequenceError } from './sequence.error';

/**
 * A sequence store did not answer one step within `tuning.storeTimeoutMs` (a read within it for
 * each next chunk): a frozen server, a network black hole, nothing refused, nothing answered. The
 * step was abandoned and treated as one that failed: a fragment is requeued as for an
 * unreachable store, a delivery whose read or outcome fails hands its sequence back. The step
 * may still take effect later; every step is one Message Sequence can meet again (a fragment
 * stored twice is a duplicate, a lease it abandoned lapses).
 */
export class SequenceStoreTimeoutError extends SequenceError {
  readonly code = 'sequence-store-timeout' as const;

  constructor(
    /** The store's `name`. */
    readonly store: string,
    /** The store method that did not answer. */
    readonly call: string,
    /** What the step was on: `<channel>/<sequence id>`, or the store's name for a store-wide step. */
    readonly subject: string,
    readonly timeoutMs: number,
  ) {
    super(
      `the ${store} sequence store did not answer ${call} on ${subject} within ${timeoutMs} ms ` +
        '(tuning.storeTimeoutMs); the step was abandoned',
    );
  }
}
