import { SequenceError } from './sequence.error';

/** What was refused: a message recorded, or a statement, savepoint or `client` access. */
export type FinishedTransactionUse = 'event' | 'command' | 'statement' | 'savepoint' | 'client';

/**
 * An `OutboxTransaction` was used after its work had returned (a call not awaited inside it, or a
 * transaction object kept for later): an event or command could no longer be written with that
 * transaction, and a statement, savepoint or `client` access would have run outside it (on a
 * connection back in the pool, in autocommit, or in the transaction that enclosed a nested one),
 * so it was refused rather than dropped or run there.
 */
export class OutboxTransactionFinishedError extends SequenceError {
  readonly code = 'outbox-transaction-finished' as const;

  constructor(
    readonly kind: FinishedTransactionUse,
    /** The message type, for an event or command; empty otherwise. */
    readonly type: string = '',
  ) {
    super(
      kind === 'event' || kind === 'command'
        ? `${kind} ${type} was recorded after its transaction's work had returned; record it ` +
            'inside the function given to transaction() (or the inbox handler), before it returns'
        : `a ${kind === 'client' ? "use of the driver's client" : kind} was refused: its ` +
            "transaction's work had returned (committed, rolled back, or a nested transaction " +
            'ended inside its enclosing one); run it inside the function given to transaction(), ' +
            'awaited, before it returns',
    );
  }
}
