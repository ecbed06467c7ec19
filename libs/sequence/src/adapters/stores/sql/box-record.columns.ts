import type { MessageKind, RecordStatus, StoredRecord } from '../../../ports/outbox-store.port';

/**
 * The columns of a box table that both SQL adapters read the same way; `seq` and `headers` come
 * back differently from each driver, and are passed in decoded.
 */
export interface BoxRecordColumns {
  readonly id: string;
  readonly kind: string;
  readonly type: string;
  readonly partition_key: string | null;
  readonly body: string;
  readonly status: string;
  readonly attempts: number;
  readonly next_attempt_at: number;
  readonly last_error: string | null;
  readonly created_at: number;
  readonly completed_at: number | null;
}

/**
 * The `next_attempt_at` (ms) that `discard-failed.sql` writes: a record that is `COMPLETED` in
 * the table with it was discarded, not handled. The schema allows only `PENDING`, `COMPLETED`
 * and `FAILED`, and claims, purges and the partial indexes all read `COMPLETED` as finished, so
 * a discarded record stays `COMPLETED` there; no other row has a time before the epoch (times
 * are checked to be at least 0, and a fresh record's is 0), and a finished record's
 * `next_attempt_at` is read by nothing else.
 */
export const DISCARDED_MARK_MS = -1;

/** A stored record from its row's columns, with its decoded `seq` and `headers`. */
export function storedRecordOf(
  row: BoxRecordColumns,
  seq: number,
  headers: Record<string, string>,
): StoredRecord {
  const discarded = row.status === 'COMPLETED' && row.next_attempt_at === DISCARDED_MARK_MS;
  return {
    seq,
    id: row.id,
    kind: row.kind as MessageKind,
    type: row.type,
    partitionKey: row.partition_key,
    body: row.body,
    headers,
    status: discarded ? 'DISCARDED' : (row.status as RecordStatus),
    attempts: row.attempts,
    // Never due again: the time it stopped being due, rather than the mark.
    nextAttemptAt: discarded ? (row.completed_at ?? 0) : row.next_attempt_at,
    lastError: row.last_error,
    createdAt: row.created_at,
    completedAt: row.completed_at,
  };
}
