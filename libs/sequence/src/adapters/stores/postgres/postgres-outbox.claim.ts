import type { Pool } from 'pg';
import { assertOutcomes, storableError } from '../../../ports/outbox-store.arguments';
import type {
  ClaimOptions,
  ClaimResult,
  RecordOutcome,
  StoredRecord,
} from '../../../ports/outbox-store.port';
import { toStoredRecord, type RecordRow } from './postgres-outbox.rows';
import type { BoxStatements } from './postgres-outbox.sql';
import { inTransaction, type PostgresStoreTransaction } from './postgres.store-transaction';

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
  const horizon = options.horizon ?? null;
  if (!options.ordered) {
    const due = await transaction.prepared<RecordRow>(statements['claim-due'], [
      now,
      limit,
      horizon,
    ]);
    return due.rows.map(toStoredRecord);
  }
  const heads = (
    await transaction.prepared<RecordRow>(statements['claim-heads'], [now, limit, horizon])
  ).rows.map(toStoredRecord);
  const partitions = [
    ...new Set(heads.flatMap((head) => (head.partitionKey === null ? [] : [head.partitionKey]))),
  ];
  if (heads.length >= limit || partitions.length === 0) return heads;

  const followers = await transaction.prepared<RecordRow & { open_before: string }>(
    statements['claim-followers'],
    [now, partitions, heads.map((head) => head.seq), limit - heads.length, horizon],
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

/** A claim's outcomes, checked and grouped by kind (one statement each). */
interface SortedOutcomes {
  readonly completed: number[];
  readonly retry: { seqs: number[]; times: number[]; errors: string[] };
  readonly failed: { seqs: number[]; errors: string[] };
}

/**
 * Writes the outcomes `handle` gave for `records`: one statement per kind of outcome, sent with
 * the claim's COMMIT. A record without an outcome is released (left as it was); a completed one
 * is deleted when `options.deleteCompleted`.
 */
export function settleOutcomes(
  transaction: PostgresStoreTransaction,
  statements: BoxStatements,
  records: readonly StoredRecord[],
  outcomes: readonly RecordOutcome[],
  options: Pick<ClaimOptions, 'now' | 'deleteCompleted'>,
): ClaimResult {
  const sorted = sortOutcomes(records, outcomes);
  writeOutcomes(transaction, statements, sorted, options);
  return {
    claimed: records.length,
    completed: sorted.completed.length,
    retried: sorted.retry.seqs.length,
    failed: sorted.failed.seqs.length,
  };
}

/**
 * The outcomes of a claim whose transaction was lost under `handle` (a statement outran
 * `query_timeout`, or the connection failed), written in a short transaction on `pool`.
 *
 * Only failed attempts are written: a `completed` outcome's work (the handler's writes, what it
 * recorded) went with the lost transaction, so its record is handed out again as if never
 * claimed. Without this, a handler whose statement always outruns the timeout would lose every
 * claim it is part of, counted nowhere, and stall its box for good.
 *
 * The row locks are taken again first, waiting for the lost transaction's server process to
 * release them (it does when its statement ends). A record that changed meanwhile (another claim
 * handled it, or counted an attempt) is left alone: the attempt seen here is stale.
 */
export async function settleLostClaim(
  pool: Pool,
  statements: BoxStatements,
  records: readonly StoredRecord[],
  outcomes: readonly RecordOutcome[],
  now: number,
): Promise<ClaimResult> {
  const sorted = sortOutcomes(records, outcomes);
  const attempted = [...sorted.retry.seqs, ...sorted.failed.seqs];
  const settled: ClaimResult = { claimed: records.length, completed: 0, retried: 0, failed: 0 };
  if (attempted.length === 0) return settled;
  const attemptsSeen = new Map(records.map((record) => [record.seq, record.attempts]));
  return inTransaction(pool, async (transaction) => {
    const { rows } = await transaction.prepared<{
      seq: string;
      status: string;
      attempts: number;
    }>(statements.relock, [attempted]);
    const unchanged = new Set(
      rows
        .filter((row) => row.status === 'PENDING' && row.attempts === attemptsSeen.get(+row.seq))
        .map((row) => Number(row.seq)),
    );
    // The failed attempts of the records still as the claim found them, sorted as before.
    const seqOf = new Map(records.map((record) => [record.id, record.seq]));
    const { retry, failed } = sortOutcomes(
      records,
      outcomes.filter(
        (outcome) =>
          (outcome.status === 'retry' || outcome.status === 'failed') &&
          unchanged.has(seqOf.get(outcome.id) as number),
      ),
    );
    writeOutcomes(transaction, statements, { completed: [], retry, failed }, { now });
    return { ...settled, retried: retry.seqs.length, failed: failed.seqs.length };
  });
}

function sortOutcomes(
  records: readonly StoredRecord[],
  outcomes: readonly RecordOutcome[],
): SortedOutcomes {
  // Refused (a RangeError) before anything is written: the claim rolls back.
  assertOutcomes(records, outcomes);
  const seqOf = new Map(records.map((record) => [record.id, record.seq]));
  const completed: number[] = [];
  const retry = { seqs: [] as number[], times: [] as number[], errors: [] as string[] };
  const failed = { seqs: [] as number[], errors: [] as string[] };

  for (const outcome of outcomes) {
    const seq = seqOf.get(outcome.id) as number;
    switch (outcome.status) {
      case 'completed':
        completed.push(seq);
        break;
      case 'retry':
        retry.seqs.push(seq);
        retry.times.push(outcome.nextAttemptAt);
        retry.errors.push(storableError(outcome.error));
        break;
      case 'failed':
        failed.seqs.push(seq);
        failed.errors.push(storableError(outcome.error));
        break;
      case 'released':
        break;
    }
  }
  return { completed, retry, failed };
}

function writeOutcomes(
  transaction: PostgresStoreTransaction,
  statements: BoxStatements,
  { completed, retry, failed }: SortedOutcomes,
  { now, deleteCompleted }: Pick<ClaimOptions, 'now' | 'deleteCompleted'>,
): void {
  // Sent with the COMMIT, in one round trip.
  if (completed.length > 0 && deleteCompleted) {
    transaction.defer(statements['delete-completed'], [completed]);
  } else if (completed.length > 0) {
    transaction.defer(statements['settle-completed'], [completed, now]);
  }
  if (retry.seqs.length > 0) {
    transaction.defer(statements['settle-retry'], [retry.seqs, retry.times, retry.errors]);
  }
  if (failed.seqs.length > 0) {
    transaction.defer(statements['settle-failed'], [failed.seqs, failed.errors]);
  }
}
