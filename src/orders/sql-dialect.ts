import type { OutboxTransaction } from 'nest-sequence';

/**
 * Runs `sql`, written with `?` placeholders, in `transaction`: as written on SQLite, with them
 * numbered `$1, $2, ...` on PostgreSQL. The one place where the demo's business SQL meets the two
 * dialects; everything else it writes is SQL both accept. Keep `?` out of string literals.
 */
export function query<Row = Record<string, unknown>>(
  transaction: OutboxTransaction,
  sql: string,
  params: readonly unknown[] = [],
): Promise<{ rows: Row[]; rowCount: number }> {
  const text = transaction.dialect === 'postgres' ? numberPlaceholders(sql) : sql;
  return transaction.query<Row>(text, params);
}

/** `count` placeholders separated by commas, for an `IN (...)` list. */
export function placeholders(count: number): string {
  return Array.from({ length: count }, () => '?').join(', ');
}

function numberPlaceholders(sql: string): string {
  let position = 0;
  return sql.replace(/\?/g, () => `$${++position}`);
}
