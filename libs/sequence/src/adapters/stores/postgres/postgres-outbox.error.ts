import { SequenceError } from '../../../core/errors/sequence.error';
import { errorMessage } from '../../../core/errors/caught';

/**
 * The PostgreSQL outbox store could not do what was asked: a driver or executor answering
 * something it does not understand, a migration that failed, or a transaction used after it
 * settled. `operation` names the store method; the message says what to fix. (Arguments out of
 * the store's contract are refused with a `RangeError`, as on every outbox store.)
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

/**
 * The connection failed while a migration's `COMMIT` was sent or answered: PostgreSQL may have
 * committed the migration or not, and no one can tell from this side. Migrating again settles
 * it: a migration that committed is listed in `<tablePrefix>outbox_migrations` and skipped, one
 * that did not is applied. `cause` is the connection's error.
 */
export class PostgresMigrationOutcomeUnknownError extends PostgresOutboxError {
  constructor(
    /** The migration whose commit was lost (`001_outbox_boxes`). */
    readonly migration: string,
    readonly tablePrefix: string,
    options: { cause: unknown },
  ) {
    super(
      'migrate',
      `the connection failed while migration ${migration} (table prefix ` +
        `${JSON.stringify(tablePrefix)}) was being committed: it may or may not have been ` +
        `applied (${errorMessage(options.cause)}). Migrate again to find out: it applies only ` +
        `what is missing, and ${tablePrefix}outbox_migrations lists each migration that committed`,
      options,
    );
  }
}
