import { setTimeout as sleep } from 'node:timers/promises';
import type { Database } from 'better-sqlite3';
import { OutboxStoreBusyError } from '../../../core/errors/outbox-store-busy.error';
import { TransactionScope } from '../sql/transaction-scope';
import { AsyncMutex } from './async-mutex';
import { SqliteOutboxError } from './sqlite-outbox.error';
import { SqliteStatementCache } from './sqlite-statement.cache';
import { SqliteStoreTransaction } from './sqlite.store-transaction';

/** Between two attempts to take a lock another connection holds: doubling up to this. */
const MAX_BUSY_PAUSE_MS = 25;

/** SQLite answers SQLITE_BUSY (and its extended codes) when another connection holds a lock. */
export function isBusy(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' && code.startsWith('SQLITE_BUSY');
}

const shared = new WeakMap<Database, SqliteOutboxConnection>();

/**
 * The one `better-sqlite3` connection of a database and its discipline: `better-sqlite3` is
 * synchronous and a connection has one transaction at a time, so concurrent async callers take
 * turns through a first-come, first-served {@link AsyncMutex}. Stores over the same `Database`
 * object share this connection (and its scope), so that they cannot open overlapping
 * transactions on it either.
 *
 * Another connection's lock (another process) is waited for here, asynchronously: attempts
 * are retried with short pauses until `busyTimeoutMs`, instead of SQLite's own busy handler,
 * which would sleep inside the call and freeze the whole process (HTTP, broker heartbeats).
 */
export class SqliteOutboxConnection {
  /** The transaction of this connection that the current async context runs in. */
  readonly scope = new TransactionScope();
  private readonly mutex = new AsyncMutex();
  private readonly queries: SqliteStatementCache;
  /**
   * Set when a failed transaction could not be rolled back (an iterator of the `Database` that
   * its work left open refuses every statement): rolled back before the next use of the
   * connection, which would otherwise run inside it, seeing and committing what it wrote.
   */
  private unfinished = false;

  private constructor(
    readonly database: Database,
    /** Closed with the connection: opened by the store rather than handed to it. */
    private readonly owned: boolean,
  ) {
    this.queries = new SqliteStatementCache(database);
  }

  /** A connection of its own over a database that the store opened (and will close). */
  static owning(database: Database): SqliteOutboxConnection {
    return new SqliteOutboxConnection(database, true);
  }

  /** The connection over a database the application opened: shared by the stores over it. */
  static over(database: Database): SqliteOutboxConnection {
    let connection = shared.get(database);
    if (!connection) {
      connection = new SqliteOutboxConnection(database, false);
      shared.set(database, connection);
    }
    return connection;
  }

  /** The database's file name, for messages. */
  get label(): string {
    return this.database.memory ? ':memory:' : this.database.name;
  }

  /** The open transaction of this connection that the current async context runs in. */
  activeTransaction(): SqliteStoreTransaction | undefined {
    const active = this.scope.active();
    // A callback that outlived its transaction (a timer set inside the work) still sees it in
    // its async context: it is not a transaction to join any more.
    return active instanceof SqliteStoreTransaction && active.isOpen ? active : undefined;
  }

  /**
   * Runs `work` in a new transaction, after the one in progress on this connection: `BEGIN
   * IMMEDIATE`, so that the write lock is taken at the start (waiting for another process's
   * transaction to end) rather than at the first write, where SQLite could only fail. Committed
   * when `work` resolves; rolled back when it throws, rethrowing.
   */
  async transaction<T>(
    busyTimeoutMs: number,
    work: (transaction: SqliteStoreTransaction) => Promise<T>,
  ): Promise<T> {
    const release = await this.mutex.acquire();
    try {
      this.finishFailedTransaction();
      await this.whenUnlocked(busyTimeoutMs, 'BEGIN IMMEDIATE', () =>
        this.database.exec('BEGIN IMMEDIATE'),
      );
      const transaction = new SqliteStoreTransaction(this, this.database, this.queries);
      let result: T;
      try {
        result = await this.scope.run(transaction, () => work(transaction));
        transaction.settle();
        this.assertStillInTransaction();
        // Holding the writes of a savepoint that could not be rolled back.
        const broken = transaction.brokenBy;
        if (broken) throw broken;
        // In WAL mode the holder of the write lock commits without waiting; in rollback-journal
        // mode COMMIT may have to wait for other connections' readers.
        await this.whenUnlocked(busyTimeoutMs, 'COMMIT', () => this.database.exec('COMMIT'));
      } catch (error) {
        transaction.settle();
        this.unfinished = true;
        try {
          this.finishFailedTransaction();
        } catch {
          // Still refused: the next use of the connection tries again. The work's error is the
          // one worth seeing.
        }
        throw error;
      }
      transaction.committed();
      return result;
    } finally {
      release();
    }
  }

  /**
   * Runs `read` (statements outside a transaction) after the transaction in progress, which
   * it would otherwise see half done: the connection is shared by every async caller.
   */
  async exclusive<T>(busyTimeoutMs: number, what: string, read: () => T): Promise<T> {
    const release = await this.mutex.acquire();
    try {
      this.finishFailedTransaction();
      return await this.whenUnlocked(busyTimeoutMs, what, read);
    } finally {
      release();
    }
  }

  /**
   * Resolves once the transaction in progress, and those already waiting, have finished; then
   * closes the database when the connection owns it. Idempotent.
   */
  async close(): Promise<void> {
    const release = await this.mutex.acquire();
    try {
      if (this.owned && this.database.open) this.database.close();
    } finally {
      release();
    }
  }

  /** Rolls back the transaction that failed without being rolled back, if any (see unfinished). */
  private finishFailedTransaction(): void {
    if (!this.unfinished) return;
    if (this.database.inTransaction) this.database.exec('ROLLBACK');
    this.unfinished = false;
  }

  private assertStillInTransaction(): void {
    if (!this.database.inTransaction) {
      throw new SqliteOutboxError(
        'transaction',
        'the SQLite transaction ended before its work resolved (a COMMIT or ROLLBACK sent ' +
          'through tx.query, or SQLite rolling back after an I/O error), so it is reported ' +
          'as failed: manage transactions with store.transaction and savepoint only',
      );
    }
  }

  /** `attempt()`, retried while another connection holds the lock it needs, for up to `timeoutMs`. */
  private async whenUnlocked<T>(timeoutMs: number, what: string, attempt: () => T): Promise<T> {
    const started = Date.now();
    let pause = 1;
    for (;;) {
      try {
        return attempt();
      } catch (error) {
        const waited = Date.now() - started;
        if (!isBusy(error)) throw error;
        if (waited >= timeoutMs) {
          throw new OutboxStoreBusyError(this.label, what, waited, { cause: error });
        }
        await sleep(Math.min(pause, timeoutMs - waited));
        pause = Math.min(pause * 2, MAX_BUSY_PAUSE_MS);
      }
    }
  }
}
