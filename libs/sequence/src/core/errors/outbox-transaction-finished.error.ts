import { SequenceError } from './sequence.error';

/**
 * An event or command was recorded on an `OutboxTransaction` whose work had already returned
 * (a call not awaited inside it, or a transaction object kept for later): it could no longer be
 * written with that transaction, so it was refused rather than dropped.
 */
export class OutboxTransactionFinishedError extends SequenceError {
  readonly code = 'outbox-transaction-finished' as const;

  constructor(
    readonly kind: 'event' | 'command',
    readonly type: string,
  ) {
    super(
      `${kind} ${type} was recorded after its transaction's work had returned; record it ` +
        'inside the function given to transaction() (or the inbox handler), before it returns',
    );
  }
}
