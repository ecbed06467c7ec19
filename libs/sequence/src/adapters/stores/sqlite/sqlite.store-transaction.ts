import { errorMessage } from '../../../core/errors/caught';
import type { Database } from 'better-sqlite3';
import { NestedTransactionOpenError } from '../../../core/errors/nested-transaction-open.error';
import { SavepointEndedError } from '../../../core/errors/savepoint-ended.error';
import type { StoreTransaction } from '../../../ports/outbox-store.port';
import { SqliteOutboxError } from './sqlite-outbox.error';
import type { SqliteStatementCache } from './sqlite-statement.cache';

/**
 * One `BEGIN IMMEDIATE` transaction of the SQLite store's connection, usable until the work it
 * was given settles. Savepoints nest (`SAVEPOINT` is a stack in SQLite): run them one after
 * another, never concurrently, within one transaction.
 */
export class SqliteStoreTransaction implements StoreTransaction {
  readonly dialect = 'sqlite' as const;
  private open = true;
  private readonly savepoints: string[] = [];
  private savepointCount = 0;
  /** Set by {@link brokenBy} once the transaction is found ended under its work. */
  private broken?: Error;
  /** Run once after the outermost COMMIT (not on rollback), keyed so that each runs once. */
  private commitHooks = new Map<string, () => void>();

  constructor(
    /** The connection this transaction is on: `append` accepts only its own store's. */
    readonly owner: object,
    private readonly database: Database,
    private readonly queries: SqliteStatementCache,
  ) {}

  /** The `better-sqlite3` `Database`, inside `BEGIN IMMEDIATE`. */
  get client(): Database {
    return this.database;
  }

  /**
   * Set once the transaction ended while its work still ran: SQLite rolled it back itself (the
   * disk or the database's `max_page_count` full, an I/O error), or a COMMIT or ROLLBACK was sent
   * through `query`; or once a savepoint of it could not be rolled back. Every later statement is
   * refused with it, and nothing of the transaction commits.
   */
  get brokenBy(): Error | undefined {
    if (!this.broken && this.open && !this.database.inTransaction) {
      this.broken = new SqliteOutboxError(
        'transaction',
        'this SQLite outbox transaction was ended early (SQLite rolling back after a full disk ' +
          'or an I/O error, or a COMMIT or ROLLBACK sent through query): nothing more can run in it',
      );
    }
    return this.broken;
  }

  /**
   * Whether SQLite itself ended the transaction under its work (it is {@link brokenBy}, and no
   * longer in progress on the connection), as opposed to one still open that must roll back.
   */
  get endedUnderWork(): boolean {
    return this.brokenBy !== undefined && !this.database.inTransaction;
  }

  /** Whether the transaction still runs (its work has not settled). */
  get isOpen(): boolean {
    return this.open;
  }

  /**
   * Runs one statement (`?` placeholders, values as `better-sqlite3` binds them: numbers,
   * strings, bigints, Buffers, null). A statement that returns rows (`SELECT`, `... RETURNING`)
   * answers them, with `rowCount` their number; any other answers `rowCount` = rows changed.
   */
  async query<Row = Record<string, unknown>>(
    sql: string,
    params: readonly unknown[] = [],
  ): Promise<{ rows: Row[]; rowCount: number }> {
    this.assertOpen();
    const statement = this.queries.get(sql);
    if (statement.reader) {
      const rows = statement.all(...params) as Row[];
      return { rows, rowCount: rows.length };
    }
    return { rows: [], rowCount: statement.run(...params).changes };
  }

  async savepoint<T>(work: () => Promise<T>): Promise<T> {
    this.assertOpen();
    const name = `nseq_savepoint_${++this.savepointCount}`;
    const hooksBefore = new Map(this.commitHooks);
    this.database.exec(`SAVEPOINT ${name}`);
    this.savepoints.push(name);
    let result: T;
    try {
      result = await work();
    } catch (error) {
      // Ended by an enclosing rollback meanwhile: nothing left to roll back.
      if (!this.savepoints.includes(name)) throw error;
      this.leaveSavepoint(name, 'rollback');
      // What the rolled-back part appended will never commit: no wake-up for it.
      this.commitHooks = hooksBefore;
      throw error;
    }
    if (!this.savepoints.includes(name)) throw new SavepointEndedError(name);
    const innermost = this.savepoints.at(-1);
    if (innermost !== name) {
      // Another savepoint opened after this one is still open (two side by side, or one a call
      // left running): SQLite nests them, so releasing this one would fold that one's writes into
      // the transaction, and left open, COMMIT would commit this one's. Refused, this one's work
      // is undone, with that one's (which then rejects too), as if it had thrown.
      this.leaveSavepoint(name, 'rollback');
      this.commitHooks = hooksBefore;
      throw new NestedTransactionOpenError(innermost!, `savepoint ${name}`);
    }
    this.leaveSavepoint(name, 'release');
    return result;
  }

  /** Throws unless statements can run in this transaction (rather than outside any). */
  assertOpen(): void {
    if (!this.open) {
      throw new SqliteOutboxError(
        'transaction',
        'this SQLite outbox transaction has already committed or rolled back: use a ' +
          'transaction only inside the work function it was given to, before that settles',
      );
    }
    const broken = this.brokenBy;
    if (broken) throw broken;
  }

  /**
   * Throws NestedTransactionOpenError when a savepoint opened in this transaction is still open:
   * a nested transaction() left running (not awaited), whose writes so far COMMIT would keep
   * whatever it does next. Its savepoints end here, with the transaction, which the caller rolls
   * back; their work, when it ends, rejects.
   */
  assertSavepointsEnded(): void {
    const open = this.savepoints[0];
    if (open === undefined) return;
    this.savepoints.length = 0;
    throw new NestedTransactionOpenError(open);
  }

  /** Runs `hook` after the outermost commit; a second hook with the same key is ignored. */
  afterCommit(key: string, hook: () => void): void {
    if (!this.commitHooks.has(key)) this.commitHooks.set(key, hook);
  }

  /** Called by the connection when the work settled, before COMMIT or ROLLBACK. */
  settle(): void {
    this.open = false;
    // Ended with it: the work of one left running rejects when it ends (SavepointEndedError),
    // sending nothing into the next transaction, whose savepoints take the same names.
    this.savepoints.length = 0;
  }

  /** Called by the connection after COMMIT. */
  committed(): void {
    for (const hook of this.commitHooks.values()) hook();
    this.commitHooks.clear();
  }

  private leaveSavepoint(name: string, how: 'rollback' | 'release'): void {
    // Only `name` itself when released (savepoint() checked it is the innermost); rolled back,
    // those opened inside it too (an abandoned call's, left open).
    const at = this.savepoints.lastIndexOf(name);
    this.savepoints.splice(at);
    // An I/O or disk-full error may have made SQLite roll the whole transaction back already.
    if (!this.database.inTransaction) return;
    if (how === 'rollback') {
      try {
        this.database.exec(`ROLLBACK TO ${name}`);
      } catch (error) {
        // Refused (an iterator of the Database left open refuses every statement): what the
        // savepoint wrote is still in the transaction, which must then not commit.
        this.broken ??= new SqliteOutboxError(
          'savepoint',
          `savepoint ${name} could not be rolled back (${errorMessage(error)}): what its work ` +
            'wrote is still in the transaction, which is therefore rolled back as a whole',
          { cause: error },
        );
        return;
      }
    }
    this.database.exec(`RELEASE ${name}`);
  }
}
