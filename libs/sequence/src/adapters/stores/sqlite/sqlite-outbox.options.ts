import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import { refuseUnknownKeys, type OptionKeysOf } from '../../../core/option-keys';

export interface SqliteOutboxStoreOptions {
  /**
   * Prepended to the table names (`<prefix>outbox_events`, ..., `<prefix>outbox_migrations`):
   * letters, digits and `_`, not starting with a digit.
   * @default ''
   */
  readonly tablePrefix?: string;
  /**
   * How long an operation waits for a lock that another connection holds (another process, or
   * another store opened on the same file) before failing with `OutboxStoreBusyError`. The wait
   * is asynchronous: the process goes on serving everything else meanwhile.
   * @default 5000
   */
  readonly busyTimeoutMs?: number;
}

const SQLITE_OUTBOX_STORE_KEYS = {
  tablePrefix: true,
  busyTimeoutMs: true,
} as const satisfies OptionKeysOf<SqliteOutboxStoreOptions>;

export interface SqliteOutboxOpenOptions extends SqliteOutboxStoreOptions {
  /** The database file (created when absent), or `':memory:'` for a database of this store alone. */
  readonly filename: string;
  /**
   * `FULL` syncs the write-ahead log at every commit, so that a commit survives a power loss;
   * `NORMAL` syncs at checkpoints only: faster, and still safe when the process crashes, but a
   * power loss may undo the last commits after a relay has published their messages (whose
   * business change would then be gone).
   * @default 'FULL'
   */
  readonly synchronous?: 'FULL' | 'NORMAL';
}

const SQLITE_OUTBOX_OPEN_KEYS = {
  ...SQLITE_OUTBOX_STORE_KEYS,
  filename: true,
  synchronous: true,
} as const satisfies OptionKeysOf<SqliteOutboxOpenOptions>;

const WHERE = 'SQLite outbox store options';
const DEFAULT_BUSY_TIMEOUT_MS = 5_000;

/**
 * Refuses a key that is not an option: of `open` when `opening`, else of the constructor. Call it
 * before opening anything.
 */
export function refuseUnknownSqliteKeys(options: object, opening: boolean): void {
  refuseUnknownKeys(WHERE, options, opening ? SQLITE_OUTBOX_OPEN_KEYS : SQLITE_OUTBOX_STORE_KEYS);
}

export function busyTimeoutOf(options: SqliteOutboxStoreOptions): number {
  const value = options.busyTimeoutMs ?? DEFAULT_BUSY_TIMEOUT_MS;
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new SequenceOptionsError(WHERE, [
      `busyTimeoutMs must be a whole number of milliseconds (0 or more), got ${String(value)}`,
    ]);
  }
  return value;
}

/**
 * The file to open. better-sqlite3 opens a temporary database, deleted on close, for a missing
 * or empty name: a store given one by mistake (an unset environment variable) would lose every
 * record at the next restart without a word.
 */
export function filenameOf(options: SqliteOutboxOpenOptions): string {
  const value: unknown = options.filename;
  if (typeof value !== 'string' || value === '') {
    throw new SequenceOptionsError(WHERE, [
      `filename must be the path of the database file, or ':memory:' for a database of the ` +
        `store alone, got ${value === '' ? 'an empty string' : String(value)}`,
    ]);
  }
  return value;
}

export function synchronousOf(options: SqliteOutboxOpenOptions): 'FULL' | 'NORMAL' {
  const value = options.synchronous ?? 'FULL';
  if (value !== 'FULL' && value !== 'NORMAL') {
    throw new SequenceOptionsError(WHERE, [
      `synchronous must be 'FULL' or 'NORMAL', got ${JSON.stringify(value)}`,
    ]);
  }
  return value;
}
