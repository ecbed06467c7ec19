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

/**
 * The failed attempts (`retry`, `failed`) of a claim whose transaction ended under its handler
 * (see `SqliteStoreTransaction.brokenBy`), written in a transaction of their own: only on the
 * records still as the claim found them (`PENDING`, same attempts), since another process may
 * have claimed them once SQLite let go of its lock. `completed` outcomes are dropped: what the
 * handler did went with the transaction. The counts of each.
 */
export function writeLostOutcomes(
  statements: SqliteOutboxStatements,
  box: BoxName,
  records: readonly StoredRecord[],
  outcomes: readonly RecordOutcome[],
): Omit<ClaimResult, 'claimed'> {
  const attemptsSeen = new Map(records.map((record) => [record.id, record.attempts]));
  const get = statements.box('get', box);
  const attempted = outcomes.filter((outcome) => {
    if (outcome.status !== 'retry' && outcome.status !== 'failed') return false;
    const row = get.get({ id: outcome.id }) as BoxRow | undefined;
    return row?.status === 'PENDING' && row.attempts === attemptsSeen.get(outcome.id);
  });
  return writeOutcomes(statements, box, attempted, { now: 0 });
}
