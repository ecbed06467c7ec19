import { SequenceError } from './sequence.error';

/**
 * Why a transaction handed to `OutboxStore.append` cannot be used:
 * - `executor`: a {@link SqlExecutor}-like connection of the caller's (joining a transaction
 *   opened elsewhere is PostgreSQL-only);
 * - `other-store`: a transaction of another store (another database connection);
 * - `settled`: a transaction of this store that has already committed or rolled back;
 * - `no-transaction`: no client at all, nothing with `query`, or a pool, whose statements each
 *   run and commit on their own, outside the caller's transaction.
 */
export type ForeignTransactionReason = 'executor' | 'other-store' | 'settled' | 'no-transaction';

const ADVICE: Record<ForeignTransactionReason, string> = {
  executor:
    'joining a transaction that the caller opened (a SqlExecutor) is supported on PostgreSQL ' +
    'only; on this store, write the business change and append in one OutboxService.transaction ' +
    '(or store.transaction) instead',
  'other-store':
    'it belongs to another store (another connection), whose commit this store cannot join; ' +
    'append through the transaction the same store gave you',
  settled:
    'that transaction has already committed or rolled back (was it used after its work ' +
    'returned?); append inside the work function, before it resolves',
  'no-transaction':
    'it is no connection inside a transaction (missing, without query(), or a pool, which runs ' +
    'each statement on a connection of its own and commits it at once); pass the client you ' +
    'ran BEGIN on',
};

/** `append` was given a transaction that the store cannot write in; nothing was appended. */
export class OutboxForeignTransactionError extends SequenceError {
  readonly code = 'outbox-foreign-transaction' as const;

  constructor(
    /** The store's name (`sqlite`, `postgres`). */
    readonly store: string,
    readonly reason: ForeignTransactionReason,
  ) {
    super(
      `outbox store ${store} cannot append in the transaction it was given: ${ADVICE[reason]}.`,
    );
  }
}
