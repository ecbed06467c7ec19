import { randomBytes } from 'node:crypto';
import { Pool } from 'pg';
import type { BoxName, RecordStatus } from 'nest-sequence/ports';

/** A box row as an operator reads it with SQL. */
export interface BoxRow {
  readonly id: string;
  readonly status: RecordStatus;
  readonly attempts: number;
  readonly lastError: string | null;
}

/**
 * The database as an operator sees it, through a small pool of its own: hands out table prefixes
 * (`ob_<hex>_`) for the stores and business tables of one test, reads box tables, and drops every
 * table under each prefix it handed out (`cleanup`).
 */
export class OutboxPostgresAdmin {
  private readonly prefixes = new Set<string>();
  private readonly pool: Pool;

  constructor(readonly url: string) {
    this.pool = new Pool({ connectionString: url, max: 3, application_name: 'nseq-fault-admin' });
    // An idle connection dropped by a server restart: the next query opens another.
    this.pool.on('error', () => undefined);
  }

  /** A fresh table prefix, registered for `cleanup`. */
  newTablePrefix(): string {
    const prefix = `ob_${randomBytes(5).toString('hex')}_`;
    this.prefixes.add(prefix);
    return prefix;
  }

  async query<Row = Record<string, unknown>>(sql: string, params: unknown[] = []): Promise<Row[]> {
    return (await this.pool.query(sql, params)).rows as Row[];
  }

  /** Every row of a box table, in append order. */
  async rows(tablePrefix: string, box: BoxName = 'outbox_events'): Promise<BoxRow[]> {
    return this.query<BoxRow>(
      `SELECT id, status, attempts, last_error AS "lastError" FROM ${tablePrefix}${box} ORDER BY seq`,
    );
  }

  /** Drops every table whose name starts with a prefix handed out so far; forgets them. */
  async cleanup(): Promise<void> {
    for (const prefix of this.prefixes) {
      const tables = await this.query<{ name: string }>(
        `SELECT tablename AS name FROM pg_tables
         WHERE schemaname = current_schema() AND starts_with(tablename, $1)`,
        [prefix],
      );
      if (tables.length > 0) {
        await this.pool.query(`DROP TABLE IF EXISTS ${tables.map((t) => t.name).join(', ')}`);
      }
    }
    this.prefixes.clear();
  }

  async close(): Promise<void> {
    await this.cleanup();
    await this.pool.end();
  }
}
