import type { NewBoxRecord, StoredRecord } from '../../../ports/outbox-store.port';
import { storedRecordOf, type BoxRecordColumns } from '../sql/box-record.columns';

/** A row of a box table, as the record statements select it. */
export interface BoxRow extends BoxRecordColumns {
  readonly seq: number;
  /** JSON. */
  readonly headers: string;
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
