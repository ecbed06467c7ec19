import { SequenceError } from './sequence.error';

/**
 * A transaction's or savepoint's work returned while a nested `transaction()` or savepoint it
 * started was still running (not awaited, or run side by side). Committing or releasing then
 * would have kept half of that work, whatever it did next, so the work that returned was rolled
 * back and this is thrown in place of its result; the nested work, when it ends, rejects too.
 */
export class NestedTransactionOpenError extends SequenceError {
  readonly code = 'nested-transaction-open' as const;

  constructor(
    /** The savepoint still open. */
    readonly savepoint: string,
    /** What returned meanwhile: the transaction, or the savepoint that encloses `savepoint`. */
    readonly returned: string = 'the transaction',
  ) {
    super(
      `savepoint ${savepoint} was still open when the work of ${returned} returned (a nested ` +
        'transaction or savepoint not awaited, or run side by side): that work was rolled back ' +
        'rather than keep half of it; await nested transactions one after another',
    );
  }
}
