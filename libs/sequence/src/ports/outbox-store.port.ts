/**
 * The four boxes, one table each (`<tablePrefix><box>`): what a service sends (outbox) and what
 * it received (inbox), events and commands apart, so that each has its own relay or processor.
 */
export const BOX_NAMES = [
  'outbox_events',
  'outbox_commands',
  'inbox_events',
  'inbox_commands',
] as const;
export type BoxName = (typeof BOX_NAMES)[number];

/** An event is a past fact; a command a directed intention. */
export type MessageKind = 'event' | 'command';

/**
 * Where a record stands. There is no persisted "processing": a claim is a row lock.
 * - `PENDING`: to be published (outbox) or handled (inbox);
 * - `COMPLETED`: published, or handled;
 * - `FAILED`: given up on after its retries, waiting for an operator to `retry` or `discard` it;
 * - `DISCARDED`: a `FAILED` record an operator discarded: never published or handled, never
 *   handed out again, its `lastError` kept and its `completedAt` the time of the discard; purged
 *   with the completed records.
 */
export type RecordStatus = 'PENDING' | 'COMPLETED' | 'FAILED' | 'DISCARDED';

/** A record as it is appended: one message, serialized. */
export interface NewBoxRecord {
  /** The message id: unique in its box; 1–200 characters. */
  readonly id: string;
  readonly kind: MessageKind;
  /** The event or command type (`OrderPlaced`, `ArchiveTask`). */
  readonly type: string;
  /**
   * Records of one partition key are handed out in append order when a claim asks for
   * `ordered` (an event's `<aggregateType>:<aggregateId>`); `null` for none.
   */
  readonly partitionKey: string | null;
  /** The message as JSON text, published (or handled) byte for byte as appended. */
  readonly body: string;
  /** String headers that travel with it (`traceparent`, the headers a received message had). */
  readonly headers: Readonly<Record<string, string>>;
}

/** A record as stored. Times are milliseconds since the epoch. */
export interface StoredRecord extends NewBoxRecord {
  /** Append order within the box (strictly increasing, never reused). */
  readonly seq: number;
  readonly status: RecordStatus;
  /** Claims settled so far with `completed`, `retry` or `failed`. */
  readonly attempts: number;
  /** A `PENDING` record is not handed out before this time. */
  readonly nextAttemptAt: number;
  readonly lastError: string | null;
  readonly createdAt: number;
  readonly completedAt: number | null;
}

/**
 * What became of one claimed record. `completed`, `retry` and `failed` each count one attempt:
 * - `completed`: done (published, or handled);
 * - `retry`: stays `PENDING`, not handed out again before `nextAttemptAt`; `error` is kept;
 * - `failed`: `FAILED` with `error`; no claim hands it out again until {@link OutboxStore.retry};
 * - `released`: untouched (not attempted: held back behind its partition, or shutting down).
 * A claimed record the handler gives no outcome for is `released`.
 */
export type RecordOutcome =
  | { readonly id: string; readonly status: 'completed' }
  | {
      readonly id: string;
      readonly status: 'retry';
      readonly nextAttemptAt: number;
      readonly error: string;
    }
  | { readonly id: string; readonly status: 'failed'; readonly error: string }
  | { readonly id: string; readonly status: 'released' };

/**
 * A transaction of the store's database, open until the function it was given to settles. Write
 * business data through it; whatever it holds commits or rolls back together.
 */
export interface StoreTransaction {
  readonly dialect: OutboxDialect;
  /**
   * The driver's own handle, for code that wants it: a `pg` `PoolClient` inside `BEGIN`, or the
   * `better-sqlite3` `Database` (inside `BEGIN IMMEDIATE`).
   */
  readonly client: unknown;
  /**
   * Set once the transaction cannot go on (PostgreSQL: its connection failed, or a statement
   * outran the pool's `query_timeout`; SQLite: it rolled the transaction back itself, after a
   * full disk or an I/O error): every later statement is refused with this error, and the
   * transaction is rolled back, whatever its work returns.
   */
  readonly brokenBy?: Error;
  /**
   * Runs one statement in this transaction. Placeholders are the dialect's own: `$1, $2` on
   * PostgreSQL, `?` on SQLite.
   */
  query<Row = Record<string, unknown>>(
    sql: string,
    params?: readonly unknown[],
  ): Promise<{ rows: Row[]; rowCount: number }>;
  /**
   * Runs `work` inside a savepoint: when it throws, what it wrote is rolled back (and the error
   * rethrown) while the rest of the transaction goes on. Savepoints of one transaction share its
   * connection: run them one after the other, not concurrently. A store that cannot keep
   * concurrent ones apart (SQLite nests every savepoint in the one opened before it) refuses the
   * one that ends while a later one is still open: it rejects and what it wrote is rolled back,
   * as when its `work` throws, never committed with the transaction.
   *
   * A savepoint that an enclosing one's rollback ended while its `work` ran (a handler call that
   * ran past its time limit, rolled back by the claim) sends nothing more once `work` settles: a
   * `RELEASE` or `ROLLBACK TO` of a savepoint that no longer exists would fail and abort the
   * transaction, which has moved on to other work. It rejects instead (with `work`'s error, if
   * it threw).
   */
  savepoint<T>(work: () => Promise<T>): Promise<T>;
}

/**
 * A transaction that someone else opened and will commit: anything with `pg`'s
 * `query(text, values)` (a `pg` `Client` or `PoolClient`, TypeORM's `QueryRunner` or
 * `EntityManager`, or a two-line adapter over Prisma's or Knex's transaction), resolving with
 * `{ rows }` or with the rows array itself. PostgreSQL only.
 */
export interface SqlExecutor {
  query(text: string, values?: unknown[]): Promise<unknown>;
}

export type OutboxDialect = 'postgres' | 'sqlite';

export interface ClaimOptions {
  /** Most records handed to one `handle` call. */
  readonly limit: number;
  /** Records with `nextAttemptAt <= now` are due. */
  readonly now: number;
  /**
   * Records with `nextAttemptAt > horizon` are due too. A relay or processor passes `now` plus its
   * `retry.maxDelayMs` (the furthest ahead it ever schedules a retry) plus a minute (for claims
   * beside it that read the clock later): a later time was written on a clock ahead of this one
   * (another instance's, or this machine's before a step set it back), and waiting for it could
   * hold the record, and in an ordered box its partition, for days.
   * @default none: only `now` decides
   */
  readonly horizon?: number;
  /**
   * Hand out a record only when every earlier record (lower `seq`) of its partition key is
   * `COMPLETED` or comes before it in this same batch: a `PENDING` (even not yet due) or `FAILED`
   * record holds back the rest of its partition, and only its partition. Records without a
   * partition key are never held back.
   */
  readonly ordered?: boolean;
  /**
   * Whether a `transaction()` the handler opens through this store joins the claim's transaction
   * (an inbox handler with `processInTransaction`, whose outbox writes must commit with its inbox
   * mark). A relay, whose handler only publishes, passes `false`: the store then need not track
   * the handler's async context, which costs CPU on every promise. A store whose handler must run
   * in the claim's transaction whatever it does (SQLite, one connection) may join anyway.
   * @default true
   */
  readonly joinable?: boolean;
  /**
   * Whether the claim's outcomes must be on disk when `claim()` resolves. A relay passes `false`:
   * its outcomes record only what the broker already confirmed, so losing the latest of them to a
   * database crash publishes those records again (at least once, same ids), in order, as a claim
   * that died before settling would. The store may then commit without waiting for its disk
   * (PostgreSQL: `synchronous_commit = off` for that transaction). A handler that writes through
   * the claim's transaction needs the default.
   * @default true
   */
  readonly durable?: boolean;
  /**
   * Delete the records whose outcome is `completed`, in the claim's transaction, instead of
   * marking them `COMPLETED`: the box then keeps no completed records, and forgets their ids (an
   * append of the same id later is a new record). Retry and failed outcomes are written as usual.
   * A relay whose box has `retentionMs: 0` passes `true`; an inbox never does (its completed
   * records are the ids that recognise duplicates).
   * @default false
   */
  readonly deleteCompleted?: boolean;
}

export interface ClaimedBatch {
  /** Due `PENDING` records in `seq` order; never empty. */
  readonly records: readonly StoredRecord[];
  /**
   * The transaction the claim holds: outcomes are written in it, so whatever the handler writes
   * through it commits with them (an inbox handler's `processInTransaction`).
   */
  readonly transaction: StoreTransaction;
  /**
   * Runs `work`, one handler call of the batch: a `transaction()` of this store started from it
   * joins the claim's transaction (when the claim is `joinable`) until `work` settles. One started
   * later, by a callback `work` left running (an event listener it did not await), opens a
   * transaction of its own: joining then would put it inside whatever the claim does at that
   * moment (the next record's savepoint), and undo it with that after its caller was told it
   * committed.
   */
  handlerCall<T>(work: () => Promise<T>): Promise<T>;
}

export interface ClaimResult {
  /** Records handed to `handle` (0: nothing was due, and `handle` was not called). */
  readonly claimed: number;
  readonly completed: number;
  readonly retried: number;
  readonly failed: number;
}

export interface BoxStats {
  readonly pending: number;
  readonly failed: number;
  /** `createdAt` of the oldest `PENDING` record, or `null` when there is none. */
  readonly oldestPendingAt: number | null;
}

export interface PurgeOptions {
  /** Delete `COMPLETED` (and `DISCARDED`) records whose `completedAt` is before this time. */
  readonly completedBefore: number;
  /** Most records one statement deletes (each statement is its own short transaction). */
  readonly batchSize: number;
  /** Most statements this call runs. @default unlimited (until a batch comes back short) */
  readonly maxBatches?: number;
}

/**
 * Port: the database of the transactional outbox and inbox.
 *
 * Contract, checked by the outbox store conformance suite:
 * - `migrate` creates (or upgrades) the four tables and their indexes; it is idempotent and safe
 *   to run from several processes at once.
 * - `transaction` runs `work` in one database transaction: committed when it resolves, rolled
 *   back when it throws (rethrowing that error). Nothing appended in a rolled-back transaction is
 *   ever claimed. Called while another transaction of this store is running in the same async
 *   context (inside its `work`, or inside a claim's `handle`), it joins that one as a savepoint
 *   instead of opening a second (which, on SQLite, would wait for the first forever).
 * - `append` adds records to a box inside `within` (a transaction of this store, or, on
 *   PostgreSQL, the caller's own open transaction). A record whose id the box already holds is
 *   not added again (the stored one stays as it is; an id repeated within one call is added once,
 *   the first copy); `append` returns the ids it added, in no particular order. Appended
 *   records are `PENDING`, due at once whatever the clocks say, with 0 attempts; `createdAt` is
 *   the appending process's clock.
 * - `claim` hands due `PENDING` records, in `seq` order, to `handle`, and writes the outcomes it
 *   returns in the same transaction as the claim (`completedAt` and attempts' times are
 *   `options.now`; with `options.deleteCompleted`, completed records are deleted instead). While one claim holds a record, no concurrent
 *   claim (this process or another) hands it out. When `handle` throws, or the process dies, the
 *   claim's transaction rolls back: its records stay as they were (`PENDING`, same attempts).
 *   So it does, rejecting with `NestedTransactionOpenError`, when `handle` returns while a
 *   `transaction()` it started (not awaited) is still open, which then rejects too.
 *   When the transaction broke under `handle` (`StoreTransaction.brokenBy`) and `handle` still
 *   returned outcomes, the failed attempts among them (`retry`, `failed`) are written in a short
 *   transaction of the store's own, on the records still as the claim found them; `completed`
 *   outcomes are dropped (what was done with them was lost with the transaction), and those
 *   records are handed out again. When the database refuses the claim's COMMIT after `handle`
 *   returned (a deferred constraint or constraint trigger that what `handle` wrote breaks, a
 *   serialization failure), `claim` rejects with a `ClaimCommitRefusedError` whose `cause` is
 *   the database's error; nothing of the claim is written.
 * - `receive` is the inbox's insert-if-absent: `added` or `duplicate` (by id, whatever the
 *   status of the record already there).
 * - `purge` deletes `COMPLETED` and `DISCARDED` records older than a time, in batches that are
 *   each a short transaction; `PENDING` and `FAILED` records are never purged.
 * - `retry` puts `FAILED` records back to `PENDING`, due at `now`, with 0 attempts (`lastError`
 *   is kept until the next attempt's outcome); other ids are ignored. `listFailed` is in `seq`
 *   order.
 * - Arguments out of this contract are refused with a `RangeError` naming the method and the
 *   argument, before anything is done: an unknown box; a record id (appended, or given to `get`,
 *   `retry` or `discard`) that is not a string of 1 to 200 characters (code points); a record
 *   whose other fields are not as `NewBoxRecord` says (headers of strings); an id, type,
 *   partition key, body, header name or header value holding NUL (U+0000) or a lone UTF-16
 *   surrogate, which no database column keeps as given; ids or records that
 *   are not an array (an empty one is no error: nothing to do); a time (`now`,
 *   `completedBefore`, `nextAttemptAt`) that is not a whole number of ms from 0 to 8.64e15 (the
 *   latest a `Date` holds); a count (`limit`, `batchSize`, `maxBatches`) that is not a whole
 *   number of at least 1; a `watch` listener that is not a function. So are a claim handler's
 *   outcomes that are not an array, name a record the batch does not hold (or one twice), or lack
 *   the error (and time) their status needs: the claim rejects, rolled back. An outcome's error
 *   holding NUL or a lone surrogate is kept with U+FFFD in their place (`lastError`), not
 *   refused: an error's text quotes what it likes, and a refusal would hand the record out again.
 * - After `close`, every method rejects (`ping` included).
 * - `watch` calls `listener` with the box soon after a transaction that appended to it (or a
 *   `receive` or `retry`) commits (PostgreSQL `LISTEN/NOTIFY`; the SQLite store in its own
 *   process). For the store's own `transaction`, this process's listeners are called before
 *   the code awaiting it goes on: `OutboxService` relies on that to wake its relays. It resolves
 *   once the subscription is live. A wake-up from another process may be lost (during a
 *   reconnect) or repeated: relays poll as well.
 * - Ordered claims follow `seq`, which is append order. Appends of one partition commit in that
 *   order when they took `lockPartitions` (PostgreSQL; SQLite's writes are serialized anyway);
 *   without it, two transactions appending to one partition may commit out of `seq` order.
 */
export interface OutboxStore {
  readonly dialect: OutboxDialect;
  /** Short name for logs and health checks (`postgres`, `sqlite`). */
  readonly name: string;
  migrate(): Promise<void>;
  transaction<T>(work: (transaction: StoreTransaction) => Promise<T>): Promise<T>;
  append(
    box: BoxName,
    records: readonly NewBoxRecord[],
    within: StoreTransaction | SqlExecutor,
  ): Promise<string[]>;
  /**
   * Optional: appends as `append` does, inside `within` (a transaction of this store), but may
   * send the records with the transaction's next statement or its commit rather than at once
   * (fewer round trips); resolves once they are queued. A failure to write them fails that
   * statement or the commit, so nothing of the transaction is written. `OutboxService` records a
   * transaction's messages this way when the store has it.
   */
  appendAtCommit?(
    box: BoxName,
    records: readonly NewBoxRecord[],
    within: StoreTransaction,
  ): Promise<void>;
  /**
   * Holds, until `within` ends, one lock per partition key, which other transactions taking the
   * same keys wait for: appends of one partition made after it commit in append order, which is
   * what `ordered` claims rely on. A store whose write transactions are serialized anyway (SQLite)
   * has nothing to do.
   */
  lockPartitions?(
    box: BoxName,
    keys: readonly string[],
    within: StoreTransaction | SqlExecutor,
  ): Promise<void>;
  /**
   * Adds a received record in a transaction of its own; `'duplicate'` when the box holds its id.
   * Receives of one partition commit in seq order, as appends after `lockPartitions` do: an
   * `ordered` claim must not hand out a record while an earlier one of its partition commits.
   */
  receive(box: BoxName, record: NewBoxRecord): Promise<'added' | 'duplicate'>;
  claim(
    box: BoxName,
    options: ClaimOptions,
    handle: (batch: ClaimedBatch) => Promise<readonly RecordOutcome[]>,
  ): Promise<ClaimResult>;
  /** The record with this id, or `undefined`. */
  get(box: BoxName, id: string): Promise<StoredRecord | undefined>;
  /** `FAILED` records, oldest first (at most `limit`). */
  listFailed(box: BoxName, limit: number): Promise<StoredRecord[]>;
  retry(box: BoxName, ids: readonly string[], now: number): Promise<number>;
  /**
   * Gives up on `FAILED` records by id (an operator's decision): each is read `DISCARDED` from
   * now on (not `COMPLETED`: it was never published or handled), with its `lastError` kept and
   * `completedAt` now; never handed out again and purged after the box's retention like a
   * completed record.
   * Its id stays known meanwhile: a redelivered copy is a `receive` duplicate, as after handling.
   * Other ids, and records that are not `FAILED`, are left alone. Resolves with how many it
   * discarded, and wakes the box's watchers when that is any (as `retry` does): in an ordered
   * box, the records held back behind a discarded one are due now. Optional.
   */
  discard?(box: BoxName, ids: readonly string[]): Promise<number>;
  purge(box: BoxName, options: PurgeOptions): Promise<number>;
  stats(box: BoxName): Promise<BoxStats>;
  /** Subscribes to wake-ups; resolves with a function that unsubscribes. */
  watch(listener: (box: BoxName) => void): Promise<() => Promise<void>>;
  /** Resolves when the database answers now; rejects saying why not (for health checks). */
  ping(): Promise<void>;
  /** Closes what the store owns (a pool it created, its database file); idempotent. */
  close(): Promise<void>;
}
