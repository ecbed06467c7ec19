import { SequenceError } from './sequence.error';

/**
 * A transaction's work returned while a nested `transaction()` or savepoint it started was still
 * running (not awaited). Its commit would have kept half of that work, whatever it did next, so
 * the transaction was rolled back; the nested work, when it ends, rejects too.
 */
export class NestedTransactionOpenError extends SequenceError {
  readonly code = 'nested-transaction-open' as const;

  constructor(readonly savepoint: string) {
    super(
      `savepoint ${savepoint} was still open when its transaction's work returned (a nested ` +
        'transaction or savepoint not awaited): the transaction was rolled back rather than ' +
        'commit half of it; await nested transactions',
    );
  }
}
