import type { NewBoxRecord, StoredRecord } from '../../../ports/outbox-store.port';
import { storedRecordOf } from '../sql/box-record.columns';

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
  return storedRecordOf(row, row.seq, JSON.parse(row.headers) as Record<string, string>);
}
