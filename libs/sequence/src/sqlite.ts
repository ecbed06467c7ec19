/**
 * `nest-sequence/sqlite`: the SQLite outbox store (peer: better-sqlite3), the embedded default of
 * the outbox, on a file for a single instance that must survive restarts.
 *
 * @module nest-sequence/sqlite
 */
export {
  SqliteOutboxStore,
  type SqliteOutboxOpenOptions,
  type SqliteOutboxStoreOptions,
} from './adapters/stores/sqlite/sqlite.outbox-store';
export {
  SQLITE_MAX_LENGTH_BYTES,
  SqliteOutboxError,
  SqliteRecordTooLargeError,
} from './adapters/stores/sqlite/sqlite-outbox.error';
