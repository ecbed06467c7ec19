import { PostgresOutboxError } from './postgres-outbox.error';
import type { NewBoxRecord, StoredRecord } from '../../../ports/outbox-store.port';
import { storedRecordOf, type BoxRecordColumns } from '../sql/box-record.columns';
import type { BoxStatements } from './postgres-outbox.sql';

/** A row as `_record-columns.sql` selects it (`pg` turns bigint into text, float8 into number). */
export interface RecordRow extends BoxRecordColumns {
  readonly seq: string;
  readonly headers: Record<string, string>;
}

/** A stored record from its row. */
export function toStoredRecord(row: RecordRow): StoredRecord {
  return storedRecordOf(row, Number(row.seq), row.headers);
}

/**
 * The statement that appends `records` and its parameters $1–$6: `append-one.sql` with plain
 * values for a single record (the common case), else `append.sql` with one array per column.
 */
export function appendStatement(
  statements: Pick<BoxStatements, 'append' | 'append-one'>,
  records: readonly NewBoxRecord[],
): { readonly sql: string; readonly columns: unknown[] } {
  if (records.length === 1) {
    const [record] = records;
    return {
      sql: statements['append-one'],
      columns: [
        record.id,
        record.kind,
        record.type,
        record.partitionKey,
        record.body,
        JSON.stringify(record.headers),
      ],
    };
  }
  return { sql: statements.append, columns: appendColumns(records) };
}

/** The parameters $1–$6 of `append.sql`: one array per column. */
function appendColumns(records: readonly NewBoxRecord[]): unknown[] {
  return [
    records.map((record) => record.id),
    records.map((record) => record.kind),
    records.map((record) => record.type),
    records.map((record) => record.partitionKey),
    records.map((record) => record.body),
    records.map((record) => JSON.stringify(record.headers)),
  ];
}

/**
 * The ids `append.sql` reported added, in the order they were given. `result` is what the
 * executor's `query` resolved to: `pg` (and Knex) give `{ rows }`, TypeORM and Prisma the rows.
 */
export function addedIds(result: unknown, records: readonly NewBoxRecord[]): string[] {
  const rows = Array.isArray(result)
    ? (result as unknown[])
    : (result as { rows?: unknown } | null | undefined)?.rows;
  const row = Array.isArray(rows) ? (rows[0] as { added?: unknown } | undefined) : undefined;
  if (!row || !('added' in row)) {
    throw new PostgresOutboxError(
      'append',
      'the executor answered neither { rows } (pg, Knex) nor an array of rows (TypeORM, Prisma); ' +
        'wrap it so that query(text, values) resolves to one of them',
    );
  }
  const added = new Set((row.added as string[] | null) ?? []);
  const ids: string[] = [];
  for (const record of records) {
    if (added.delete(record.id)) ids.push(record.id);
  }
  return ids;
}
