import { SequenceError } from './sequence.error';

/** An outbox store was used after `close()` was called on it. */
export class OutboxStoreClosedError extends SequenceError {
  readonly code = 'outbox-store-closed' as const;

  constructor(
    /** The store's name (`sqlite`, `postgres`). */
    readonly store: string,
    readonly operation: string,
  ) {
    super(
      `outbox store ${store}: ${operation} was called after close(); open a new store (the ` +
        'module does on restart) instead of using a closed one.',
    );
  }
}
