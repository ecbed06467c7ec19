import { SequenceError } from '../../../core/errors/sequence.error';

/**
 * The PostgreSQL outbox store could not do what was asked: an argument it cannot use (an unknown
 * box, an outcome for a record the claim did not hand out), a driver or executor answering
 * something it does not understand, a migration that failed, or a transaction used after it
 * settled. `operation` names the store method; the message says what to fix.
 */
export class PostgresOutboxError extends SequenceError {
  readonly code = 'postgres-outbox' as const;

  constructor(
    readonly operation: string,
    detail: string,
    options?: { cause?: unknown },
  ) {
    super(`postgres outbox store, ${operation}: ${detail}`, options);
  }
}
