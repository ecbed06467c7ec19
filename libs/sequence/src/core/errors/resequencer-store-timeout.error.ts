import { SequenceError } from './sequence.error';

/**
 * A resequencer store did not answer one step within `tuning.storeTimeoutMs` (a frozen server, a
 * network black hole: nothing refused, nothing answered). The step was abandoned and treated as
 * one that failed: an input is requeued as for an unreachable store, a drain stops and leaves
 * its items for the next one. The step may still take effect later; every step is one the
 * resequencer can meet again (a repeated event is a duplicate, a lease it abandoned lapses).
 */
export class ResequencerStoreTimeoutError extends SequenceError {
  readonly code = 'resequencer-store-timeout' as const;

  constructor(
    /** The store's `name`. */
    readonly store: string,
    /** The store method that did not answer. */
    readonly call: string,
    /** What the step was on: `<resequencer>/<key>`, or the resequencer's name alone. */
    readonly subject: string,
    readonly timeoutMs: number,
  ) {
    super(
      `the ${store} resequencer store did not answer ${call} on ${subject} within ${timeoutMs} ms ` +
        '(tuning.storeTimeoutMs); the step was abandoned',
    );
  }
}
