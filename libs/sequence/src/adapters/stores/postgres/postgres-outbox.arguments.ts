import { PostgresOutboxError } from './postgres-outbox.error';
import type { NewBoxRecord } from '../../../ports/outbox-store.port';

/**
 * Checks records before they reach the database, so that a bad one fails with a message naming
 * it rather than with a constraint violation that aborts the caller's transaction.
 */
export function assertNewRecords(operation: string, records: readonly NewBoxRecord[]): void {
  for (const record of records) {
    // Characters as PostgreSQL counts them (code points), not UTF-16 units.
    const length = typeof record.id === 'string' ? [...record.id].length : 0;
    if (length < 1 || length > 200) {
      throw new PostgresOutboxError(
        operation,
        `record id ${JSON.stringify(record.id)} must be a string of 1 to 200 characters`,
      );
    }
    if (record.kind !== 'event' && record.kind !== 'command') {
      throw new PostgresOutboxError(
        operation,
        `record ${record.id}: kind must be 'event' or 'command', not ${JSON.stringify(record.kind)}`,
      );
    }
  }
}

/** Throws unless `value` is a positive integer (a limit, a batch size). */
export function assertCount(operation: string, name: string, value: number): void {
  if (!Number.isSafeInteger(value) || value < 1) {
    throw new PostgresOutboxError(operation, `${name} must be a positive integer, not ${value}`);
  }
}

/** Throws unless `value` is a finite time in milliseconds. */
export function assertTime(operation: string, name: string, value: number): void {
  if (!Number.isFinite(value)) {
    throw new PostgresOutboxError(operation, `${name} must be a time in ms, not ${value}`);
  }
}
