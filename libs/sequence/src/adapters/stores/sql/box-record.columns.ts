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

/** A stored record from its row's columns, with its decoded `seq` and `headers`. */
export function storedRecordOf(
  row: BoxRecordColumns,
  seq: number,
  headers: Record<string, string>,
): StoredRecord {
  return {
    seq,
    id: row.id,
    kind: row.kind as MessageKind,
    type: row.type,
    partitionKey: row.partition_key,
    body: row.body,
    headers,
    status: row.status as RecordStatus,
    attempts: row.attempts,
    nextAttemptAt: row.next_attempt_at,
    lastError: row.last_error,
    createdAt: row.created_at,
    completedAt: row.completed_at,
  };
}
