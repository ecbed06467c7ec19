import type { NewBoxRecord, StoredRecord } from '../../../ports/outbox-store.port';
import { storedRecordOf, type BoxRecordColumns } from '../sql/box-record.columns';
import { SQLITE_MAX_LENGTH_BYTES, SqliteRecordTooLargeError } from './sqlite-outbox.error';

/** A row of a box table, as the record statements select it. */
export interface BoxRow extends BoxRecordColumns {
  readonly seq: number;
  /** JSON. */
  readonly headers: string;
}

type AppendParameters = Record<string, string | number | null>;

/**
 * The named parameters of `append.sql` for `record`, into `box`.
 * @throws SqliteRecordTooLargeError when its text is over what SQLite takes in a row, which
 *   better-sqlite3 would refuse with a bare `RangeError` (or SQLite with `SQLITE_TOOBIG`)
 */
export function appendParameters(
  box: string,
  record: NewBoxRecord,
  createdAt: number,
): AppendParameters {
  const parameters: AppendParameters = {
    id: record.id,
    kind: record.kind,
    type: record.type,
    partitionKey: record.partitionKey ?? null,
    body: record.body,
    headers: JSON.stringify(record.headers),
    createdAt,
  };
  // No UTF-16 unit takes more than 3 bytes in UTF-8: most records need no count.
  const units = Object.values(parameters).reduce<number>(
    (sum, value) => sum + (typeof value === 'string' ? value.length : 0),
    0,
  );
  if (units * 3 > SQLITE_MAX_LENGTH_BYTES) {
    const bytes = textBytes(parameters);
    if (bytes > SQLITE_MAX_LENGTH_BYTES) throw recordTooLarge(box, parameters);
  }
  return parameters;
}

/**
 * The error for a record SQLite refused as too big (a row over its limit, with the overheads of
 * the row that `appendParameters` does not count), or `undefined` for any other error.
 */
export function tooLargeError(
  error: unknown,
  box: string,
  parameters: AppendParameters,
): SqliteRecordTooLargeError | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  const bound = error instanceof RangeError && /too big/.test(error.message);
  return code === 'SQLITE_TOOBIG' || bound ? recordTooLarge(box, parameters, error) : undefined;
}

function recordTooLarge(
  box: string,
  parameters: AppendParameters,
  cause?: unknown,
): SqliteRecordTooLargeError {
  return new SqliteRecordTooLargeError(
    'append',
    box,
    String(parameters.id),
    textBytes(parameters),
    SQLITE_MAX_LENGTH_BYTES,
    cause === undefined ? undefined : { cause },
  );
}

/** The record's text columns in UTF-8 bytes. */
function textBytes(parameters: AppendParameters): number {
  let bytes = 0;
  for (const value of Object.values(parameters)) {
    if (typeof value === 'string') bytes += Buffer.byteLength(value, 'utf8');
  }
  return bytes;
}

export function toStoredRecord(row: BoxRow): StoredRecord {
  return storedRecordOf(row, row.seq, JSON.parse(row.headers) as Record<string, string>);
}
