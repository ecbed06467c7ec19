import type {
  BoxName,
  ClaimOptions,
  ClaimResult,
  RecordOutcome,
  StoredRecord,
} from '../../../ports/outbox-store.port';
import { storableError } from '../../../ports/outbox-store.arguments';
import { BOX_NAMES } from '../../../ports/outbox-store.port';
import { toStoredRecord, type BoxRow } from './sqlite-outbox.codec';
import { forTable, sqliteOutboxSql, type SqliteOutboxStatements } from './sqlite-outbox.sql';

/**
 * The store's multi-statement steps, run by it inside a transaction that it holds (`better-sqlite3`
 * is synchronous: nothing else runs on the connection meanwhile).
 */

/** Applies the migrations not recorded yet, each to the four box tables, and records them. */
export function applyMigrations(statements: SqliteOutboxStatements): void {
  statements.migration('migrations-table').run();
  for (const migration of sqliteOutboxSql().migrations) {
    if (statements.migration('migration-applied').get({ version: migration.version })) continue;
    for (const box of BOX_NAMES) {
      statements.database.exec(forTable(migration.sql, statements.table(box)));
    }
    statements
      .migration('migration-record')
      .run({ version: migration.version, name: migration.name, appliedAt: Date.now() });
  }
}

/** The due records a claim hands out (see `claim-due-ordered.sql` for `ordered`). */
export function selectClaimable(
  statements: SqliteOutboxStatements,
  box: BoxName,
  { limit, now, horizon, ordered }: ClaimOptions,
): StoredRecord[] {
  const select = statements.box(ordered ? 'claim-due-ordered' : 'claim-due', box);
  return (select.all({ now, horizon: horizon ?? null, limit }) as BoxRow[]).map(toStoredRecord);
}

/**
 * Writes a claim's outcomes (checked by assertOutcomes); the counts of each. Completed records
 * are deleted when `deleteCompleted` (see ClaimOptions).
 */
export function writeOutcomes(
  statements: SqliteOutboxStatements,
  box: BoxName,
  outcomes: readonly RecordOutcome[],
  { now, deleteCompleted }: Pick<ClaimOptions, 'now' | 'deleteCompleted'>,
): Omit<ClaimResult, 'claimed'> {
  const counts = { completed: 0, retried: 0, failed: 0 };
  for (const outcome of outcomes) {
    const { id } = outcome;
    switch (outcome.status) {
      case 'completed':
        counts.completed += deleteCompleted
          ? statements.box('delete-completed', box).run({ id }).changes
          : statements.box('settle-completed', box).run({ id, now }).changes;
        break;
      case 'retry':
        counts.retried += statements.box('settle-retry', box).run({
          id,
          nextAttemptAt: outcome.nextAttemptAt,
          error: storableError(outcome.error),
        }).changes;
        break;
      case 'failed':
        counts.failed += statements
          .box('settle-failed', box)
          .run({ id, error: storableError(outcome.error) }).changes;
        break;
      case 'released':
        break;
    }
  }
  return counts;
}
