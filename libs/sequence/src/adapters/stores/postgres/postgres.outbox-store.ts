import type { ClientConfig, Pool } from 'pg';
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
  assertPartitionKeys,
  assertPurgeOptions,
  assertRecordId,
  assertTime,
} from '../../../ports/outbox-store.arguments';
import { TransactionScope } from '../sql/transaction-scope';
import { PostgresOutboxAnnouncer } from './postgres-outbox.announcer';
import { newOwnedPool } from './postgres-client';
import { migrateOutbox } from './postgres-migrations';
import { lockBatch, settleLostClaim, settleOutcomes } from './postgres-outbox.claim';
import { PostgresOutboxListener } from './postgres-outbox.listener';
import {
  POSTGRES_OUTBOX_DEFAULTS,
  resolvePostgresOutboxOptions,
  type PostgresOutboxConnectOptions,
  type PostgresOutboxStoreOptions,
  type ResolvedPostgresOutboxOptions,
} from './postgres-outbox.options';
import { addedIds, appendStatement, toStoredRecord, type RecordRow } from './postgres-outbox.rows';
import { outboxStatements, type BoxStatements } from './postgres-outbox.sql';
import {
  inTransaction,
  isCommitRefusal,
  PostgresStoreTransaction,
} from './postgres.store-transaction';

const NOTHING_CLAIMED: ClaimResult = { claimed: 0, completed: 0, retried: 0, failed: 0 };
/** A claim's commit that does not wait for its WAL record to reach the disk. */
const LAZY_COMMIT = 'SET LOCAL synchronous_commit TO off';
/**
 * A claim idles in its transaction while its batch is published (the broker's confirms) or
 * handled (an inbox handler's work outside the database). A server-side
 * idle_in_transaction_session_timeout shorter than that would end the claim under it: a relay's
 * records would be published again at every poll, for ever and uncounted, and an inbox record
 * would be freed for another instance while its handler still ran, which would run it a second
 * time. The relay bounds its claims itself (publish.confirmTimeoutMs and its retries); an inbox
 * claim by handlerTimeoutMs, which a handler that may hang needs. Sent with the claim's first
 * statement, in the same round trip.
 */
const NO_IDLE_TIMEOUT = 'SET LOCAL idle_in_transaction_session_timeout TO 0';

/**
 * The outbox store on PostgreSQL: one table per box (`<tablePrefix><box>`, see
 * `sql/migrations`), claims as `SELECT ... FOR UPDATE SKIP LOCKED` inside a transaction that
 * lasts as long as the handler, wake-ups through `LISTEN/NOTIFY`.
 *
 * @example
 * const store = PostgresOutboxStore.connect(process.env.DATABASE_URL!, { tablePrefix: 'app_' });
 * await store.migrate();
 */
export class PostgresOutboxStore implements OutboxStore {
  readonly dialect = 'postgres' as const;
  readonly name = 'postgres';
  readonly tablePrefix: string;
  readonly notifyChannel: string;

  private readonly options: ResolvedPostgresOutboxOptions;
  private readonly statements: Readonly<Record<BoxName, BoxStatements>>;
  private readonly scope = new TransactionScope();
  private readonly watchers = new Set<{ listener: (box: BoxName) => void }>();
  private listener: PostgresOutboxListener | undefined;
  private listening: Promise<void> | undefined;
  /** Ends the pool, when the store created it. */
  private endOwnPool: (() => Promise<void>) | undefined;
  private readonly announcer: PostgresOutboxAnnouncer;
  private closing: Promise<void> | undefined;

  /** A store over `pool`, which stays the caller's: `close()` does not end it. */
  constructor(
    private readonly pool: Pool,
    options: PostgresOutboxStoreOptions = {},
  ) {
    this.options = resolvePostgresOutboxOptions(options);
    this.tablePrefix = this.options.tablePrefix;
    this.notifyChannel = this.options.notifyChannel;
    this.statements = outboxStatements(this.tablePrefix);
    this.announcer = new PostgresOutboxAnnouncer(
      pool,
      this.notifyChannel,
      (box) => this.wake(box),
      (boxes) => this.listener?.announce(boxes) ?? Promise.resolve(false),
    );
  }

  /** A store with a pool of its own, which `close()` ends. */
  static connect(url: string, options: PostgresOutboxConnectOptions = {}): PostgresOutboxStore {
    const owned = newOwnedPool(url, { ...POSTGRES_OUTBOX_DEFAULTS.pool, ...options.pool });
    // An idle client whose connection drops makes the pool emit 'error'; unheard, that would
    // end the process. The next checkout simply opens a new connection.
    owned.pool.on('error', () => undefined);
    const store = new PostgresOutboxStore(owned.pool, options);
    store.endOwnPool = () => owned.end();
    return store;
  }

  /** Creates or upgrades the tables (see {@link migrateOutbox}). */
  async migrate(): Promise<void> {
    this.assertOpen('migrate');
    await migrateOutbox(this.pool, { tablePrefix: this.tablePrefix });
  }

  async transaction<T>(work: (transaction: StoreTransaction) => Promise<T>): Promise<T> {
    this.assertOpen('transaction');
    let opened: PostgresStoreTransaction | undefined;
    const result = await this.scope.join(
      (inner) =>
        inTransaction(this.pool, async (transaction) => {
          opened = transaction;
          const result = await inner(transaction);
          // A nested transaction() the work left running: COMMIT would keep its writes so far.
          // (A claim checks the same before it writes its outcomes.)
          transaction.assertSavepointsEnded();
          return result;
        }),
      work,
    );
    // Only the transaction that committed announces (a joined one is part of it).
    if (opened) this.announcer.announce(opened.appended);
    return result;
  }

  async append(
    box: BoxName,
    records: readonly NewBoxRecord[],
    within: StoreTransaction | SqlExecutor,
  ): Promise<string[]> {
    const statements = this.statementsOf(box, 'append');
    assertNewRecords('append', records);
    this.assertJoinable(within);
    if (within instanceof PostgresStoreTransaction && within.isSettled) {
      throw new OutboxForeignTransactionError(this.name, 'settled');
    }
    if (isStoreTransaction(within) && within.dialect !== 'postgres') {
      throw new OutboxForeignTransactionError(this.name, 'other-store');
    }
    if (records.length === 0) return [];
    // Our own transaction is announced after its commit; a caller's carries its NOTIFY.
    const { sql, columns } = appendStatement(statements, records);
    if (within instanceof PostgresStoreTransaction) {
      const params = [...columns, Date.now(), null, box];
      const result = await within.prepared(sql, params);
      const added = addedIds(result, records);
      if (added.length > 0) within.appended.add(box);
      return added;
    }
    const params = [...columns, Date.now(), this.notifyChannel, box];
    return addedIds(await within.query(sql, params), records);
  }

  /**
   * Appends `records` with the commit of `within`, a transaction of this store: sent with its
   * next statement or its `COMMIT`, in the same round trip. Ids already in the box are skipped as
   * by `append`; a failure fails that statement, or the commit, and nothing is written.
   */
  async appendAtCommit(
    box: BoxName,
    records: readonly NewBoxRecord[],
    within: StoreTransaction,
  ): Promise<void> {
    if (!(within instanceof PostgresStoreTransaction)) {
      await this.append(box, records, within);
      return;
    }
    const statements = this.statementsOf(box, 'appendAtCommit');
    assertNewRecords('appendAtCommit', records);
    if (within.isSettled) throw new OutboxForeignTransactionError(this.name, 'settled');
    if (records.length === 0) return;
    const { sql, columns } = appendStatement(statements, records);
    const params = [...columns, Date.now(), null, box];
    within.defer(sql, params, (result) => {
      if (addedIds(result, records).length > 0) within.appended.add(box);
    });
  }

  async lockPartitions(
    box: BoxName,
    keys: readonly string[],
    within: StoreTransaction | SqlExecutor,
  ): Promise<void> {
    const statements = this.statementsOf(box, 'lockPartitions');
    assertPartitionKeys('lockPartitions', keys);
    this.assertJoinable(within);
    if (keys.length > 0) await within.query(statements['lock-partitions'], [[...keys]]);
  }

  /** Throws unless `within` can hold a statement of the caller's transaction: see the reasons. */
  private assertJoinable(within: StoreTransaction | SqlExecutor): void {
    const candidate = within as unknown as Record<string, unknown> | null | undefined;
    const isPool =
      typeof candidate?.connect === 'function' &&
      typeof candidate.release !== 'function' &&
      'totalCount' in candidate &&
      'idleCount' in candidate;
    if (typeof candidate?.query !== 'function' || isPool) {
      throw new OutboxForeignTransactionError(this.name, 'no-transaction');
    }
  }

  async receive(box: BoxName, record: NewBoxRecord): Promise<'added' | 'duplicate'> {
    const statements = this.statementsOf(box, 'receive');
    assertNewRecord('receive', record);
    // One statement: its own transaction, committed before this resolves, having taken the
    // record's partition lock first (see receive.sql).
    const { columns } = appendStatement(statements, [record]);
    const result = await this.pool.query(statements.receive, [...columns, Date.now(), null, box]);
    const added = addedIds(result, [record]).length === 1;
    if (added) this.announcer.announce(new Set([box]));
    return added ? 'added' : 'duplicate';
  }

  async claim(
    box: BoxName,
    options: ClaimOptions,
    handle: (batch: ClaimedBatch) => Promise<readonly RecordOutcome[]>,
  ): Promise<ClaimResult> {
    const statements = this.statementsOf(box, 'claim');
    assertClaimOptions(options);
    // Always a transaction of its own, even when called inside another one: the claim's locks
    // must last exactly as long as its handler.
    let claimed: PostgresStoreTransaction | undefined;
    /** Set once the batch is handled and its outcomes queued: what fails after is the COMMIT. */
    let handled = false;
    let lost:
      { records: StoredRecord[]; outcomes: readonly RecordOutcome[]; backend?: number } | undefined;
    const result = await inTransaction(this.pool, async (transaction) => {
      claimed = transaction;
      transaction.defer(NO_IDLE_TIMEOUT, []);
      const records = await lockBatch(transaction, statements, options);
      if (records.length === 0) return NOTHING_CLAIMED;
      const joinable = options.joinable !== false;
      const batch: ClaimedBatch = {
        records,
        transaction,
        handlerCall: (work) => (joinable ? this.scope.run(transaction, work) : work()),
      };
      const outcomes = joinable
        ? await this.scope.run(transaction, () => handle(batch))
        : await handle(batch);
      if (transaction.brokenBy) {
        // A handler's statement outran query_timeout (or the connection failed): nothing more
        // can be written in this transaction, and it must not be committed. Its outcomes are
        // settled below, once it is gone.
        lost = { records, outcomes, backend: backendOf(transaction) };
        throw transaction.brokenBy;
      }
      // A transaction() that handle left running: COMMIT would keep its writes so far, whatever
      // it does next. The claim rolls back with it, as transaction() does.
      transaction.assertSavepointsEnded();
      // Sent with the COMMIT: no round trip, and no wait for the WAL flush (see ClaimOptions).
      if (options.durable === false) transaction.defer(LAZY_COMMIT, []);
      const settled = settleOutcomes(transaction, statements, records, outcomes, options);
      handled = true;
      return settled;
    }).catch(async (error: unknown) => {
      if (!lost)
        throw handled && isCommitRefusal(error) ? new ClaimCommitRefusedError(error) : error;
      // The server process of the lost transaction goes on with its statement (PostgreSQL does
      // not notice a client that gave up while it waits on a lock), holding the claim's row
      // locks: the failed attempts could not be written behind it. Ended, it lets them go.
      if (lost.backend !== undefined) {
        // Refused (a role without the right to signal it) or failed: the relock below then
        // waits for the statement to end, up to query_timeout, as it would without this.
        await this.pool
          .query('SELECT pg_terminate_backend($1)', [lost.backend])
          .catch(() => undefined);
      }
      return settleLostClaim(this.pool, statements, lost.records, lost.outcomes, options.now);
    });
    // What handlers recorded in the claim's transaction (an inbox handler's events).
    if (claimed) this.announcer.announce(claimed.appended);
    return result;
  }

  async get(box: BoxName, id: string): Promise<StoredRecord | undefined> {
    const statements = this.statementsOf(box, 'get');
    assertRecordId('get', id);
    const { rows } = await this.reader().query<RecordRow>(statements.get, [id]);
    return rows.length > 0 ? toStoredRecord(rows[0]) : undefined;
  }

  async listFailed(box: BoxName, limit: number): Promise<StoredRecord[]> {
    const statements = this.statementsOf(box, 'listFailed');
    assertLimit('listFailed', 'limit', limit);
    const { rows } = await this.reader().query<RecordRow>(statements['list-failed'], [limit]);
    return rows.map(toStoredRecord);
  }

  async retry(box: BoxName, ids: readonly string[], now: number): Promise<number> {
    const statements = this.statementsOf(box, 'retry');
    assertIds('retry', ids);
    assertTime('retry', 'now', now);
    if (ids.length === 0) return 0;
    const { rows } = await this.reader().query<{ retried: string }>(statements['retry-failed'], [
      ids,
      now,
      this.notifyChannel,
      box,
    ]);
    return Number(rows[0].retried);
  }

  async discard(box: BoxName, ids: readonly string[]): Promise<number> {
    const statements = this.statementsOf(box, 'discard');
    assertIds('discard', ids);
    if (ids.length === 0) return 0;
    const { rows } = await this.reader().query<{ discarded: string }>(
      statements['discard-failed'],
      [ids, this.notifyChannel, box, Date.now()],
    );
    return Number(rows[0].discarded);
  }

  async purge(box: BoxName, options: PurgeOptions): Promise<number> {
    const statements = this.statementsOf(box, 'purge');
    assertPurgeOptions(options);
    let purged = 0;
    for (let batch = 0; options.maxBatches === undefined || batch < options.maxBatches; batch++) {
      const { rowCount } = await this.pool.query(statements.purge, [
        options.completedBefore,
        options.batchSize,
      ]);
      purged += rowCount ?? 0;
      if ((rowCount ?? 0) < options.batchSize) break;
    }
    return purged;
  }

  async stats(box: BoxName): Promise<BoxStats> {
    const { rows } = await this.reader().query<{
      pending: string;
      failed: string;
      oldest_pending_at: number | null;
    }>(this.statementsOf(box, 'stats').stats);
    const [row] = rows;
    return {
      pending: Number(row.pending),
      failed: Number(row.failed),
      oldestPendingAt: row.oldest_pending_at,
    };
  }

  /**
   * Wakes `listener` when a transaction that appended to a box commits (on any store sharing
   * the tables and the channel), and with every box after the LISTEN connection came back from
   * a drop. The first subscription opens that connection and resolves once it listens; it
   * rejects when it cannot connect.
   */
  async watch(listener: (box: BoxName) => void): Promise<() => Promise<void>> {
    this.assertOpen('watch');
    assertListener(listener);
    const watcher = { listener };
    this.watchers.add(watcher);
    if (!this.listener) {
      const started = new PostgresOutboxListener({
        connection: this.listenConnection(),
        channel: this.notifyChannel,
        wake: (box) => this.wake(box),
        initialBackoffMs: this.options.listenBackoffMs,
        maxBackoffMs: this.options.listenMaxBackoffMs,
      });
      this.listener = started;
      this.listening = started.start().catch((error: unknown) => {
        if (this.listener === started) this.listener = undefined;
        throw error;
      });
    }
    try {
      await this.listening;
    } catch (error) {
      this.watchers.delete(watcher);
      throw error;
    }
    return async () => {
      if (!this.watchers.delete(watcher) || this.watchers.size > 0) return;
      await this.stopListening();
    };
  }

  /** The LISTEN connection's `application_name` (to find it in `pg_stat_activity`). */
  get listenerApplicationName(): string | undefined {
    return this.listener?.applicationName;
  }

  async ping(): Promise<void> {
    this.assertOpen('ping');
    await this.pool.query('SELECT 1');
  }

  /** Stops watching, and ends the pool when the store created it; idempotent. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      this.watchers.clear();
      await this.announcer.flush();
      await this.stopListening();
      await this.endOwnPool?.();
    })();
    return this.closing;
  }

  private async stopListening(): Promise<void> {
    const listener = this.listener;
    this.listener = undefined;
    this.listening = undefined;
    await listener?.stop();
  }

  private wake(box: BoxName): void {
    for (const { listener } of [...this.watchers]) {
      try {
        listener(box);
      } catch {
        // A wake-up is a hint (relays poll as well): one listener's failure must not keep it
        // from the others, nor break the LISTEN connection's event handling.
      }
    }
  }

  /**
   * Where a read (or an operator's retry) runs: in the transaction the caller is inside (an inbox
   * handler calling `OutboxService.record`), else on the pool. A claim holds a pooled client for
   * as long as its handler runs; waiting for a second one from a small pool could wait forever.
   */
  private reader(): Pick<StoreTransaction, 'query'> {
    return this.scope.active() ?? this.pool;
  }

  private listenConnection(): ClientConfig {
    return this.options.listenConnection ?? { ...(this.pool.options as ClientConfig) };
  }

  private assertOpen(operation: string): void {
    if (this.closing) throw new OutboxStoreClosedError(this.name, operation);
  }

  private statementsOf(box: BoxName, operation: string): BoxStatements {
    this.assertOpen(operation);
    assertBox(operation, box);
    return this.statements[box];
  }
}

function isStoreTransaction(within: StoreTransaction | SqlExecutor): within is StoreTransaction {
  return 'dialect' in within && typeof within.savepoint === 'function';
}

/** The server process id of a transaction's connection (pg's `Client.processID`), if known. */
function backendOf(transaction: PostgresStoreTransaction): number | undefined {
  return transaction.backend;
}
