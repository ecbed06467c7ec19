/**
 * PostgreSQL's own counts for an Outbox benchmark path, per 1,000 messages: the WAL it wrote
 * (`pg_stat_wal`: server-wide, so other tenants' writes count too) and what the path did to its
 * outbox table (`pg_stat_user_tables`, `pg_statio_user_tables`, `pg_stat_user_indexes`): rows
 * inserted, updated (HOT or not) and deleted, heap blocks touched, and index entries each index
 * handed to scans. A backend reports its counts when it exits, at the latest: read them once the
 * path's pools have ended.
 */
import { Pool } from 'pg';
import { settings, sleep } from './outbox.settings';

export interface WalReading {
  readonly records: number;
  readonly fpi: number;
  readonly bytes: number;
}

/** Per 1,000 messages; `table` only for paths with an outbox table. */
export interface PgStatsPerThousand {
  readonly wal: { records: number; fullPageImages: number; kib: number };
  readonly table?: {
    inserted: number;
    updated: number;
    hotUpdated: number;
    deleted: number;
    heapBlocks: number;
    /** Index entries read by scans, per index (suffix of its name). */
    indexEntriesRead: Record<string, number>;
  };
}

async function withPool<T>(work: (pool: Pool) => Promise<T>): Promise<T> {
  const pool = new Pool({ connectionString: settings.databaseUrl, max: 1 });
  pool.on('error', () => undefined);
  try {
    return await work(pool);
  } finally {
    await pool.end();
  }
}

export function walNow(): Promise<WalReading> {
  return withPool(async (pool) => {
    const { rows } = await pool.query<{ records: string; fpi: string; bytes: string }>(
      'SELECT wal_records AS records, wal_fpi AS fpi, wal_bytes AS bytes FROM pg_stat_wal',
    );
    return { records: +rows[0].records, fpi: +rows[0].fpi, bytes: +rows[0].bytes };
  });
}

const perThousand = (value: number, messages: number) =>
  Math.round((value * 1000 * 10) / messages) / 10;

/**
 * The counts since `walBefore` (and of `table`, when given, since it was created), per 1,000
 * messages. Waits a moment first: an ended backend's report reaches the statistics shortly after.
 */
export async function pgStatsSince(
  walBefore: WalReading,
  messages: number,
  table?: string,
): Promise<PgStatsPerThousand> {
  await sleep(300);
  return withPool(async (pool) => {
    const { rows } = await pool.query<{ records: string; fpi: string; bytes: string }>(
      'SELECT wal_records AS records, wal_fpi AS fpi, wal_bytes AS bytes FROM pg_stat_wal',
    );
    const wal = {
      records: perThousand(+rows[0].records - walBefore.records, messages),
      fullPageImages: perThousand(+rows[0].fpi - walBefore.fpi, messages),
      kib: perThousand((+rows[0].bytes - walBefore.bytes) / 1024, messages),
    };
    if (table === undefined) return { wal };
    const counts = await pool.query<Record<string, string>>(
      `SELECT t.n_tup_ins AS ins, t.n_tup_upd AS upd, t.n_tup_hot_upd AS hot,
              t.n_tup_del AS del,
              coalesce(io.heap_blks_hit, 0) + coalesce(io.heap_blks_read, 0) AS heap
       FROM pg_stat_user_tables t JOIN pg_statio_user_tables io USING (relid)
       WHERE t.relname = $1`,
      [table],
    );
    const indexes = await pool.query<{ name: string; read: string }>(
      `SELECT indexrelname AS name, idx_tup_read AS read FROM pg_stat_user_indexes
       WHERE relname = $1 ORDER BY indexrelname`,
      [table],
    );
    const row = counts.rows[0] ?? {};
    return {
      wal,
      table: {
        inserted: perThousand(+row.ins, messages),
        updated: perThousand(+row.upd, messages),
        hotUpdated: perThousand(+row.hot, messages),
        deleted: perThousand(+row.del, messages),
        heapBlocks: perThousand(+row.heap, messages),
        indexEntriesRead: Object.fromEntries(
          indexes.rows.map((index) => [
            index.name.slice(table.length + 1) || index.name,
            perThousand(+index.read, messages),
          ]),
        ),
      },
    };
  });
}
