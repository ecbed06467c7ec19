import { SequenceError } from './sequence.error';

/**
 * The outbox store's database stayed locked by another connection for longer than the store
 * waits (SQLite: another process, or another store on the same file, held the write lock for
 * more than `busyTimeoutMs`). Nothing was run: the operation can be retried as it is.
 */
export class OutboxStoreBusyError extends SequenceError {
  readonly code = 'outbox-store-busy' as const;

  constructor(
    /** The database (a file name) that was locked. */
    readonly database: string,
    /** What could not start (`BEGIN IMMEDIATE`, a read). */
    readonly operation: string,
    readonly waitedMs: number,
    options?: { cause?: unknown },
  ) {
    super(
      `outbox store: ${operation} on ${database} waited ${waitedMs} ms for a lock that another ` +
        'connection holds (another process, or another store opened on the same file); nothing ' +
        'was run. Retry, raise busyTimeoutMs, or keep the other writer’s transactions short.',
      options,
    );
  }
}
