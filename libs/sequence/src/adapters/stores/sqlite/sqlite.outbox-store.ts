import { setImmediate as nextTurn } from 'node:timers/promises';
import type { Database, Statement } from 'better-sqlite3';
import { OutboxForeignTransactionError } from '../../../core/errors/outbox-foreign-transaction.error';
import { OutboxStoreClosedError } from '../../../core/errors/outbox-store-closed.error';
import { ClaimCommitRefusedError } from '../../../core/errors/claim-commit-refused.error';
import type {
  BoxName,
  BoxStats,
  ClaimedBatch,
  ClaimOptions,
  ClaimResult,
  NewBoxRecord,
  OutboxStore,
  PurgeOptions,
  RecordOutcome,
  SqlExecutor,
  StoredRecord,
  StoreTransaction,
} from '../../../ports/outbox-store.port';
import {
  assertBox,
  assertClaimOptions,
  assertIds,
  assertLimit,
  assertListener,
  assertNewRecord,
  assertNewRecords,
  assertOutcomes,
  assertPurgeOptions,
  assertRecordId,
  assertTime,
} from '../../../ports/outbox-store.arguments';
import {
  appendParameters,
  tooLargeError,
  toStoredRecord,
  type BoxRow,
} from './sqlite-outbox.codec';
import { SqliteOutboxConnection } from './sqlite-outbox.connection';
import { SqliteOutboxError } from './sqlite-outbox.error';
import {
  busyTimeoutOf,
  filenameOf,
  refuseUnknownSqliteKeys,
  synchronousOf,
  type SqliteOutboxOpenOptions,
  type SqliteOutboxStoreOptions,
} from './sqlite-outbox.options';
import {
  applyMigrations,
  selectClaimable,
  writeLostOutcomes,
  writeOutcomes,
} from './sqlite-outbox.records';
import { SqliteOutboxStatements } from './sqlite-outbox.sql';
import { SqliteOutboxWakeups, wakeupChannel } from './sqlite-outbox.wakeups';
import { openSqliteDatabase } from './sqlite-database';
import { SqliteStoreTransaction } from './sqlite.store-transaction';

export type { SqliteOutboxOpenOptions, SqliteOutboxStoreOptions } from './sqlite-outbox.options';

const NOTHING_CLAIMED: ClaimResult = { claimed: 0, completed: 0, retried: 0, failed: 0 };

/** Databases opened by {@link SqliteOutboxStore.open}, whose store closes them. */
const openedByStore = new WeakSet<Database>();

/**
 * The outbox and inbox in a SQLite database (through `better-sqlite3`): the embedded default,
 * with nothing to run beside the application.
 *
 * One connection serves the whole process: its transactions take turns, first come first served,
 * and a claim holds the connection while its handler runs, so that other transactions of the
 * process wait for it (keep claim batches small). Other processes may open the same file: each
 * transaction starts with `BEGIN IMMEDIATE` and waits (up to `busyTimeoutMs`) for theirs.
 * `append` writes only within this store's own transactions: joining a transaction that the
 * application opened elsewhere is PostgreSQL-only.
 *
 * @example
 * const store = await SqliteOutboxStore.open({ filename: 'data/outbox.db' });
 * await store.migrate();
 */
export class SqliteOutboxStore implements OutboxStore {
  readonly dialect = 'sqlite' as const;
  readonly name = 'sqlite';
  private readonly connection: SqliteOutboxConnection;
  private readonly statements: SqliteOutboxStatements;
  private readonly wakeups: SqliteOutboxWakeups;
  private readonly channel: string;
  private readonly busyTimeoutMs: number;
  private ping$?: Statement;
  private closing?: Promise<void>;

  /**
   * A store over a database that the application opened and will close (`close()` leaves it
   * open). Stores over the same `Database` object share its connection discipline. The store
   * changes none of its settings: WAL mode is recommended, and `timeout: 0` lets the store wait
   * for other processes' locks without blocking the event loop (SQLite's own wait blocks it).
   *
   * The store's transactions and claims stay open across awaits on that one connection: a
   * statement the application runs on `database` directly meanwhile (a repository's write, say)
   * joins the open transaction, and is rolled back with it or made durable only when it commits.
   * Write through `OutboxService.transaction` (or `store.transaction`), or give other work a
   * `Database` of its own.
   */
  constructor(database: Database, options: SqliteOutboxStoreOptions = {}) {
    const owned = openedByStore.delete(database);
    refuseUnknownSqliteKeys(options, owned);
    const tablePrefix = options.tablePrefix ?? '';
    this.busyTimeoutMs = busyTimeoutOf(options);
    this.statements = new SqliteOutboxStatements(database, tablePrefix);
    this.connection = owned
      ? SqliteOutboxConnection.owning(database)
      : SqliteOutboxConnection.over(database);
    this.channel = wakeupChannel(database, tablePrefix);
    this.wakeups = new SqliteOutboxWakeups(this.channel);
  }

  /**
   * Opens (creating it when absent) a database file that the store owns and `close()` closes,
   * in WAL mode (readers of other processes do not block its writes).
   */
  static async open(options: SqliteOutboxOpenOptions): Promise<SqliteOutboxStore> {
    refuseUnknownSqliteKeys(options, true);
    const synchronous = synchronousOf(options);
    const database = openSqliteDatabase(filenameOf(options));
    openedByStore.add(database);
    try {
      const store = new SqliteOutboxStore(database, options);
      // Switching to WAL needs a lock that another process may hold: waited for like any other.
      await store.read('open', () => {
        database.pragma('journal_mode = WAL');
        database.pragma(`synchronous = ${synchronous}`);
      });
      return store;
    } catch (error) {
      openedByStore.delete(database);
      database.close();
      throw error;
    }
  }

  /** Creates the four box tables and their indexes (version 1); idempotent, in one transaction. */
  async migrate(): Promise<void> {
    await this.inTransaction(async () => applyMigrations(this.statements));
  }

  transaction<T>(work: (transaction: StoreTransaction) => Promise<T>): Promise<T> {
    return this.inTransaction(work);
  }

  async append(
    box: BoxName,
    records: readonly NewBoxRecord[],
    within: StoreTransaction | SqlExecutor,
  ): Promise<string[]> {
    assertBox('append', box);
    assertNewRecords('append', records);
    const transaction = this.ownTransaction(within);
    const insert = this.statements.box('append', box);
    const createdAt = Date.now();
    const added: string[] = [];
    for (const record of records) {
      const parameters = appendParameters(box, record, createdAt);
      let changes: number;
      try {
        changes = insert.run(parameters).changes;
      } catch (error) {
        throw tooLargeError(error, box, parameters) ?? error;
      }
      if (changes > 0) added.push(record.id);
    }
    if (added.length > 0) {
      transaction.afterCommit(`${this.channel}\u0000${box}`, () => this.wakeups.notify(box));
    }
    return added;
  }

  async receive(box: BoxName, record: NewBoxRecord): Promise<'added' | 'duplicate'> {
    assertBox('receive', box);
    assertNewRecord('receive', record);
    // Its own transaction, committed before this resolves (the caller acks the broker then).
    // Joining one would let the caller ack a row that may still roll back; waiting for one the
    // caller is inside would never end.
    if (this.connection.activeTransaction()) {
      throw new SqliteOutboxError(
        'receive',
        `receive(${box}) was called inside a transaction of the store: the inbox row must be ` +
          'committed on its own before the message is acked; call it outside the transaction',
      );
    }
    const added = await this.isolated((transaction) => this.append(box, [record], transaction));
    return added.length > 0 ? 'added' : 'duplicate';
  }

  async claim(
    box: BoxName,
    options: ClaimOptions,
    handle: (batch: ClaimedBatch) => Promise<readonly RecordOutcome[]>,
  ): Promise<ClaimResult> {
    assertBox('claim', box);
    assertClaimOptions(options);
    // A transaction of its own, taken in turn, never the one the code that woke the relay runs
    // in: joining it would publish rows that transaction might still roll back.
    /** Set once the batch is handled and its outcomes written: what fails after is the COMMIT. */
    let handled = false;
    /** What a claim whose transaction ended under its handler leaves to settle after it. */
    let lost: { records: StoredRecord[]; outcomes: readonly RecordOutcome[] } | undefined;
    return this.isolated(async (transaction) => {
      const records = selectClaimable(this.statements, box, options);
      if (records.length === 0) return NOTHING_CLAIMED;
      // The handler runs inside the transaction's scope: a transaction() it opens joins this one.
      // So does one that something it left running opens after it returned (unlike on
      // PostgreSQL): the claim holds the database's one write lock until the batch is done, and a
      // transaction of its own would wait for it, for ever if a later handler waits for that.
      const outcomes = await handle({ records, transaction, handlerCall: (work) => work() });
      const broken = transaction.brokenBy;
      if (broken && transaction.endedUnderWork) {
        // SQLite rolled the transaction back under the handler (a full disk, an I/O error): its
        // failed attempts are written below, in a transaction of their own, so that a record
        // whose handling always does this ends FAILED rather than being handed out for ever.
        // Broken but still open (a savepoint's rollback refused), it rolls back as a whole below.
        assertOutcomes(records, outcomes);
        lost = { records, outcomes };
        throw broken;
      }
      transaction.assertOpen();
      // A transaction() that handle left running: COMMIT would keep its writes so far, whatever
      // it does next. The claim rolls back with it, as transaction() does.
      transaction.assertSavepointsEnded();
      assertOutcomes(records, outcomes);
      const counts = writeOutcomes(this.statements, box, outcomes, options);
      handled = true;
      return { claimed: records.length, ...counts };
    }).catch(async (error: unknown) => {
      if (lost) return this.settleLostClaim(box, lost.records, lost.outcomes);
      // A deferred foreign key that what the handlers wrote breaks: SQLite checks it at COMMIT.
      throw handled && isConstraintError(error) ? new ClaimCommitRefusedError(error) : error;
    });
  }

  /** The failed attempts of a claim whose transaction ended under its handler (see claim). */
  private async settleLostClaim(
    box: BoxName,
    records: readonly StoredRecord[],
    outcomes: readonly RecordOutcome[],
  ): Promise<ClaimResult> {
    const settled: ClaimResult = { claimed: records.length, completed: 0, retried: 0, failed: 0 };
    if (!outcomes.some((outcome) => outcome.status === 'retry' || outcome.status === 'failed')) {
      return settled;
    }
    const counts = await this.isolated(async () =>
      writeLostOutcomes(this.statements, box, records, outcomes),
    );
    return { ...settled, ...counts, completed: 0 };
  }

  async get(box: BoxName, id: string): Promise<StoredRecord | undefined> {
    assertBox('get', box);
    assertRecordId('get', id);
    const row = await this.read(
      'get',
      () => this.statements.box('get', box).get({ id }) as BoxRow | undefined,
    );
    return row && toStoredRecord(row);
  }

  async listFailed(box: BoxName, limit: number): Promise<StoredRecord[]> {
    assertBox('listFailed', box);
    assertLimit('listFailed', 'limit', limit);
    const rows = await this.read(
      'listFailed',
      () => this.statements.box('list-failed', box).all({ limit }) as BoxRow[],
    );
    return rows.map(toStoredRecord);
  }

  async retry(box: BoxName, ids: readonly string[], now: number): Promise<number> {
    assertBox('retry', box);
    assertIds('retry', ids);
    assertTime('retry', 'now', now);
    if (ids.length === 0) return 0;
    return this.inTransaction(async (transaction) => {
      const changes = this.statements
        .box('retry-failed', box)
        .run({ ids: JSON.stringify(ids), now }).changes;
      if (changes > 0) {
        transaction.afterCommit(`${this.channel}\u0000${box}`, () => this.wakeups.notify(box));
      }
      return changes;
    });
  }

  async discard(box: BoxName, ids: readonly string[]): Promise<number> {
    assertBox('discard', box);
    assertIds('discard', ids);
    if (ids.length === 0) return 0;
    return this.inTransaction(async (transaction) => {
      const changes = this.statements
        .box('discard-failed', box)
        .run({ ids: JSON.stringify(ids), now: Date.now() }).changes;
      // In an ordered box, what was held back behind a discarded record is due now.
      if (changes > 0) {
        transaction.afterCommit(`${this.channel}\u0000${box}`, () => this.wakeups.notify(box));
      }
      return changes;
    });
  }

  /** Deletes in batches, each its own transaction, letting other work in between. */
  async purge(box: BoxName, options: PurgeOptions): Promise<number> {
    assertBox('purge', box);
    assertPurgeOptions(options);
    const { completedBefore: before, batchSize: limit, maxBatches = Infinity } = options;
    let deleted = 0;
    for (let batch = 1; batch <= maxBatches; batch += 1) {
      const changes = await this.inTransaction(
        async () => this.statements.box('purge-completed', box).run({ before, limit }).changes,
      );
      deleted += changes;
      if (changes < limit) break;
      await nextTurn();
    }
    return deleted;
  }

  async stats(box: BoxName): Promise<BoxStats> {
    assertBox('stats', box);
    const row = await this.read(
      'stats',
      () =>
        this.statements.box('stats', box).get() as {
          pending: number;
          failed: number;
          oldest_pending_at: number | null;
        },
    );
    return { pending: row.pending, failed: row.failed, oldestPendingAt: row.oldest_pending_at };
  }

  /** Listeners hear of commits of the stores on this database file in this process only. */
  async watch(listener: (box: BoxName) => void): Promise<() => Promise<void>> {
    this.assertOpen('watch');
    assertListener(listener);
    const remove = this.wakeups.add(listener);
    return async () => remove();
  }

  /**
   * Does not wait for the transaction in progress (a claim whose handler is slow is not a
   * database that does not answer): `SELECT 1` reads no table, so it may run in the middle of it.
   */
  async ping(): Promise<void> {
    this.assertOpen('ping');
    this.ping$ ??= this.connection.database.prepare('SELECT 1');
    this.ping$.get();
  }

  /**
   * Waits for the transaction in progress (and those already waiting), then closes the database
   * when the store opened it. Later calls reject with `OutboxStoreClosedError`. Idempotent.
   */
  close(): Promise<void> {
    if (!this.closing && this.connection.activeTransaction()) {
      return Promise.reject(
        new SqliteOutboxError(
          'close',
          'close() was called inside a transaction of the store it closes, which it ' +
            'would wait for forever; close the store after the transaction settles',
        ),
      );
    }
    this.closing ??= (async () => {
      this.wakeups.removeAll();
      await this.connection.close();
    })();
    return this.closing;
  }

  /**
   * `work` in the transaction the current async context runs in (as a savepoint), or else in a
   * new one (what TransactionScope.join does, but a transaction that already settled is not
   * joined: a timer set inside a transaction's work may run after it).
   */
  private async inTransaction<T>(
    work: (transaction: SqliteStoreTransaction) => Promise<T>,
  ): Promise<T> {
    const active = this.connection.activeTransaction();
    if (active) return active.savepoint(() => work(active));
    this.assertOpen('transaction');
    return this.connection.transaction(this.busyTimeoutMs, async (transaction) => {
      const result = await work(transaction);
      // A nested transaction() the work left running: COMMIT would keep its writes so far. (A
      // claim checks the same before it writes its outcomes.)
      transaction.assertSavepointsEnded();
      return result;
    });
  }

  /** `work` in a new transaction, after the one in progress, whatever the async context. */
  private isolated<T>(work: (transaction: SqliteStoreTransaction) => Promise<T>): Promise<T> {
    this.assertOpen('transaction');
    return this.connection.scope.outside(() =>
      this.connection.transaction(this.busyTimeoutMs, work),
    );
  }

  /** Statements outside a transaction, or inside the active one (waiting for it would never end). */
  private async read<T>(what: string, read: () => T): Promise<T> {
    if (this.connection.activeTransaction()) return read();
    this.assertOpen(what);
    return this.connection.exclusive(this.busyTimeoutMs, what, read);
  }

  private ownTransaction(within: StoreTransaction | SqlExecutor): SqliteStoreTransaction {
    if (!(within instanceof SqliteStoreTransaction)) {
      const isStoreTransaction =
        typeof (within as Partial<StoreTransaction>)?.savepoint === 'function';
      throw new OutboxForeignTransactionError(
        this.name,
        isStoreTransaction ? 'other-store' : 'executor',
      );
    }
    if (within.owner !== this.connection) {
      throw new OutboxForeignTransactionError(this.name, 'other-store');
    }
    if (!within.isOpen) throw new OutboxForeignTransactionError(this.name, 'settled');
    within.assertOpen();
    return within;
  }

  private assertOpen(operation: string): void {
    if (this.closing) throw new OutboxStoreClosedError(this.name, operation);
  }
}

/** Whether `error` is SQLite's for a constraint (`SQLITE_CONSTRAINT_FOREIGNKEY` and the like). */
function isConstraintError(error: unknown): boolean {
  const code =
    error !== null && typeof error === 'object' ? (error as { code?: unknown }).code : undefined;
  return typeof code === 'string' && code.startsWith('SQLITE_CONSTRAINT');
}
