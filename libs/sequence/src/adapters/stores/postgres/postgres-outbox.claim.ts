import { PostgresOutboxError } from '../../../core/errors/postgres-outbox.error';
import type {
  ClaimOptions,
  ClaimResult,
  RecordOutcome,
  StoredRecord,
} from '../../../ports/outbox-store.port';
import { toStoredRecord, type RecordRow } from './postgres-outbox.rows';
import type { BoxStatements } from './postgres-outbox.sql';
import type { PostgresStoreTransaction } from './postgres.store-transaction';

/**
 * Locks the records of one claim in `transaction` (FOR UPDATE SKIP LOCKED: rows another claim
 * holds are passed over, not waited for) and returns them in seq order.
 *
 * Ordered claims take the heads of their partitions first (records with no earlier unfinished
 * record in their partition), then, up to the limit, the due records that directly follow those
 * heads, so that one busy partition does not advance by a single record per claim.
 */
export async function lockBatch(
  transaction: PostgresStoreTransaction,
  statements: BoxStatements,
  options: ClaimOptions,
): Promise<StoredRecord[]> {
  const { now, limit } = options;
  if (!options.ordered) {
    const due = await transaction.prepared<RecordRow>(statements['claim-due'], [now, limit]);
    return due.rows.map(toStoredRecord);
  }
  const heads = (
    await transaction.prepared<RecordRow>(statements['claim-heads'], [now, limit])
  ).rows.map(toStoredRecord);
  const partitions = [
    ...new Set(heads.flatMap((head) => (head.partitionKey === null ? [] : [head.partitionKey]))),
  ];
  if (heads.length >= limit || partitions.length === 0) return heads;

  const followers = await transaction.prepared<RecordRow & { open_before: string }>(
    statements['claim-followers'],
    [now, partitions, heads.map((head) => head.seq), limit - heads.length],
  );
  const inBatch = new Map(partitions.map((key) => [key, 1]));
  const batch = [...heads];
  for (const row of followers.rows) {
    const key = row.partition_key as string;
    const before = inBatch.get(key) ?? 0;
    // Every earlier unfinished record of the partition must already be in the batch; a row
    // skipped because someone else holds it would otherwise be overtaken. The follower stays
    // locked until this claim settles, untouched, as a released record would.
    if (Number(row.open_before) !== before) continue;
    inBatch.set(key, before + 1);
    batch.push(toStoredRecord(row));
  }
  return batch.sort((a, b) => a.seq - b.seq);
}

/**
 * Writes the outcomes `handle` gave for `records`: one statement per kind of outcome. A record
 * without an outcome is released (left as it was).
 */
export async function settleOutcomes(
  transaction: PostgresStoreTransaction,
  statements: BoxStatements,
  records: readonly StoredRecord[],
  outcomes: readonly RecordOutcome[],
  now: number,
): Promise<ClaimResult> {
  const seqOf = new Map(records.map((record) => [record.id, record.seq]));
  const seen = new Set<string>();
  const completed: number[] = [];
  const retry = { seqs: [] as number[], times: [] as number[], errors: [] as string[] };
  const failed = { seqs: [] as number[], errors: [] as string[] };

  for (const outcome of outcomes) {
    const seq = seqOf.get(outcome.id);
    if (seq === undefined) {
      throw new PostgresOutboxError(
        'claim',
        `the handler returned an outcome for record ${outcome.id}, which this claim did not ` +
          'hand out; return outcomes only for batch.records',
      );
    }
    if (seen.has(outcome.id)) {
      throw new PostgresOutboxError(
        'claim',
        `the handler returned two outcomes for record ${outcome.id}; return one per record`,
      );
    }
    seen.add(outcome.id);
    switch (outcome.status) {
      case 'completed':
        completed.push(seq);
        break;
      case 'retry':
        assertTime(outcome.nextAttemptAt, outcome.id);
        retry.seqs.push(seq);
        retry.times.push(outcome.nextAttemptAt);
        retry.errors.push(outcome.error);
        break;
      case 'failed':
        failed.seqs.push(seq);
        failed.errors.push(outcome.error);
        break;
      case 'released':
        break;
      default:
        throw new PostgresOutboxError(
          'claim',
          `the handler returned an unknown outcome status for record ${(outcome as RecordOutcome).id}`,
        );
    }
  }

  if (completed.length > 0) {
    await transaction.prepared(statements['settle-completed'], [completed, now]);
  }
  if (retry.seqs.length > 0) {
    await transaction.prepared(statements['settle-retry'], [retry.seqs, retry.times, retry.errors]);
  }
  if (failed.seqs.length > 0) {
    await transaction.prepared(statements['settle-failed'], [failed.seqs, failed.errors]);
  }
  return {
    claimed: records.length,
    completed: completed.length,
    retried: retry.seqs.length,
    failed: failed.seqs.length,
  };
}

function assertTime(time: number, id: string): void {
  if (!Number.isFinite(time)) {
    throw new PostgresOutboxError(
      'claim',
      `the retry outcome of record ${id} has nextAttemptAt ${String(time)}; give a time in ms`,
    );
  }
}
