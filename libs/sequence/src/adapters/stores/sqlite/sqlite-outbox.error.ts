import { constants } from 'node:buffer';
import { SequenceError } from '../../../core/errors/sequence.error';

/**
 * The SQLite outbox store could not do what was asked: a transaction used after it settled or
 * ended under its work, a savepoint that could not be rolled back, a call made where it would
 * wait for itself. `operation` names the store method; the message says what to fix. (Arguments
 * out of the store's contract are refused with a `RangeError`, as on every outbox store.)
 */
export class SqliteOutboxError extends SequenceError {
  readonly code: 'sqlite-outbox' | 'sqlite-record-too-large' = 'sqlite-outbox';

  constructor(
    readonly operation: string,
    detail: string,
    options?: { cause?: unknown },
  ) {
    super(`sqlite outbox store, ${operation}: ${detail}`, options);
  }
}

/**
 * The most bytes SQLite takes in one string or row here: `better-sqlite3` lowers SQLite's
 * `SQLITE_LIMIT_LENGTH` (1,000,000,000 by default) to the longest string Node holds
 * (536,870,888 on 64-bit Node 20), so that whatever SQLite returns fits in one.
 */
export const SQLITE_MAX_LENGTH_BYTES = Math.min(constants.MAX_LENGTH, constants.MAX_STRING_LENGTH);

/**
 * A record is larger than SQLite stores in one row (its body, headers and other text, in UTF-8,
 * over {@link SQLITE_MAX_LENGTH_BYTES}): nothing of the call was written.
 */
export class SqliteRecordTooLargeError extends SqliteOutboxError {
  override readonly code = 'sqlite-record-too-large' as const;

  constructor(
    operation: string,
    readonly box: string,
    readonly id: string,
    /** The record's text in UTF-8 bytes: body, headers (as JSON), id, type, partition key. */
    readonly bytes: number,
    readonly limitBytes: number,
    options?: { cause?: unknown },
  ) {
    super(
      operation,
      `record ${JSON.stringify(id)} of ${box} takes ${bytes} bytes, over SQLite's limit of ` +
        `${limitBytes} bytes per row (SQLITE_LIMIT_LENGTH, as better-sqlite3 sets it); nothing ` +
        'was written. Send a payload that large through Claim Check (a ticket in the message, the ' +
        'payload in a payload store), or use the PostgreSQL outbox store',
      options,
    );
  }
}
