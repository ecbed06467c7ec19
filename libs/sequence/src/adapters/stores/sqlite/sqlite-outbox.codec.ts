import type {
  MessageKind,
  NewBoxRecord,
  RecordStatus,
  StoredRecord,
} from '../../../ports/outbox-store.port';

/** A row of a box table, as the record statements select it. */
export interface BoxRow {
  readonly seq: number;
  readonly id: string;
  readonly kind: string;
  readonly type: string;
  readonly partition_key: string | null;
  readonly body: string;
  readonly headers: string;
  readonly status: string;
  readonly attempts: number;
  readonly next_attempt_at: number;
  readonly last_error: string | null;
  readonly created_at: number;
  readonly completed_at: number | null;
}

/** The named parameters of `append.sql` for `record`. */
export function appendParameters(
  record: NewBoxRecord,
  createdAt: number,
): Record<string, string | number | null> {
  return {
    id: record.id,
    kind: record.kind,
    type: record.type,
    partitionKey: record.partitionKey ?? null,
    body: record.body,
    headers: JSON.stringify(record.headers),
    createdAt,
  };
}

export function toStoredRecord(row: BoxRow): StoredRecord {
  return {
    seq: row.seq,
    id: row.id,
    kind: row.kind as MessageKind,
    type: row.type,
    partitionKey: row.partition_key,
    body: row.body,
    headers: JSON.parse(row.headers) as Record<string, string>,
    status: row.status as RecordStatus,
    attempts: row.attempts,
    nextAttemptAt: row.next_attempt_at,
    lastError: row.last_error,
    createdAt: row.created_at,
    completedAt: row.completed_at,
  };
}
