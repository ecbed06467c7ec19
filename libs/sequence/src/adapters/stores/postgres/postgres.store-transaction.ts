import { createHash } from 'node:crypto';
import type { BoxName } from '../../../ports/outbox-store.port';
import type { Pool, PoolClient, QueryResult } from 'pg';
import { PostgresOutboxError } from './postgres-outbox.error';
import { NestedTransactionOpenError } from '../../../core/errors/nested-transaction-open.error';
import { SavepointEndedError } from '../../../core/errors/savepoint-ended.error';
import { errorMessage } from '../../../core/errors/caught';
import type { StoreTransaction } from '../../../ports/outbox-store.port';
import { checkOut } from './postgres-client';
import { isConnectionError } from '../../../core/errors/connection-errors';
import { failedStepOf, runPipeline, type PipelineStep } from './postgres-pipeline';

/** A statement whose result nobody awaits: sent with the transaction's next statement. */
interface DeferredStep {
  readonly step: PipelineStep;
  readonly onResult?: (result: QueryResult) => void;
}

const BEGIN: PipelineStep = { text: 'BEGIN' };
const COMMIT: PipelineStep = { text: 'COMMIT' };

/**
 * One open transaction on a pool client. Savepoints are numbered per transaction (`sp_1`,
 * `sp_2`, ...) so that nested ones never reuse a name. Savepoints of one transaction nest; two
 * started side by side (not awaited one after the other) would interleave on the single
 * connection, so nested transactions of one transaction run one at a time.
 *
 * Round trips: `BEGIN` is sent with the first statement, in the same round trip (a transaction
 * that sends none sends no `BEGIN` and no `COMMIT` either); statements the store defers (records
 * written at commit, a claim's outcomes) go with the next statement or with the `COMMIT`. Each
 * round trip costs both processes a few system calls and a wake-up: with one statement of its own,
 * a transaction takes one round trip instead of three.
 */
export class PostgresStoreTransaction implements StoreTransaction {
  readonly dialect = 'postgres' as const;
  private savepoints = 0;
  /** The savepoints in effect, outermost first: a rollback to one ends those inside it. */
  private readonly inEffect: string[] = [];
  private settled = false;
  /** Set when a statement found the connection gone or unusable: nothing more is sent on it. */
  private broken?: Error;
  /** Boxes appended to (or received into) in this transaction: announced after its commit. */
  readonly appended = new Set<BoxName>();
  /** Whether BEGIN has been sent (it goes with the first statement). */
  private begun = false;
  private deferred: DeferredStep[] = [];
  /** What was sent when `client` was handed out, not awaited yet. */
  private handedOut: Promise<unknown> | undefined;
  /**
   * The last round trip sent, until it ends (never rejects). A round trip may queue its steps one
   * by one (statements the connection has not prepared yet): what is sent after it waits for it,
   * lest a ROLLBACK or COMMIT be queued before its last steps, which would then run outside the
   * transaction.
   */
  private inFlight: Promise<unknown> | undefined;

  /** What `client` hands out: the connection, but for `release` (see {@link guarded}). */
  private readonly handedOutClient: PoolClient;

  constructor(private readonly connection: PoolClient) {
    this.handedOutClient = guarded(connection);
  }

  /**
   * The `pg` client, inside `BEGIN`: handing it out sends `BEGIN` first, so that what its holder
   * sends on it runs inside the transaction, and with it what waits for the next statement (behind
   * the holder's own statements when a round trip is still in flight: inside the transaction all
   * the same).
   */
  get client(): PoolClient {
    if (!this.settled && !this.broken && (!this.begun || this.deferred.length > 0)) {
      const sending = this.send([]);
      sending.catch(() => undefined); // awaited by the next statement, or the COMMIT
      this.handedOut = sending;
    }
    return this.handedOutClient;
  }

  /** The server process of the connection (`pg`'s `processID`), without sending anything. */
  get backend(): number | undefined {
    const id = (this.connection as { processID?: unknown }).processID;
    return typeof id === 'number' && Number.isInteger(id) && id > 0 ? id : undefined;
  }

  /** The error that made the connection unusable, if a statement met one (caught or not). */
  get brokenBy(): Error | undefined {
    return this.broken;
  }

  async query<Row = Record<string, unknown>>(
    sql: string,
    params: readonly unknown[] = [],
  ): Promise<{ rows: Row[]; rowCount: number }> {
    return this.run<Row>({ text: sql, values: params });
  }

  /**
   * A statement of the store's own, as a named prepared statement (named by a hash of its text):
   * parsed and planned once per connection, then only bound and executed. The append's text
   * alone was most of the bytes a commit sent, and its parsing much of the server's work.
   */
  prepared<Row = Record<string, unknown>>(
    sql: string,
    params: readonly unknown[],
  ): Promise<{ rows: Row[]; rowCount: number }> {
    return this.run<Row>({ name: statementName(sql), text: sql, values: params });
  }

  /**
   * A statement of the store's own (prepared, as {@link prepared}) whose result is not awaited:
   * it is sent with the transaction's next statement, or with its `COMMIT`, in the same round
   * trip. If it fails, that statement (or the commit) fails with its error, and nothing of the
   * transaction is written. `onResult` gets its result then.
   */
  defer(sql: string, params: readonly unknown[], onResult?: (result: QueryResult) => void): void {
    this.assertUsable();
    this.deferred.push({
      step: { name: statementName(sql), text: sql, values: params },
      onResult,
    });
  }

  private async run<Row>(step: PipelineStep): Promise<{ rows: Row[]; rowCount: number }> {
    this.assertUsable();
    const [result] = await this.send([step]);
    return { rows: result.rows as Row[], rowCount: result.rowCount ?? 0 };
  }

  private assertUsable(): void {
    if (this.settled) {
      throw new PostgresOutboxError(
        'transaction',
        'this transaction has already committed or rolled back (its client is back in the pool); ' +
          'run the statement inside the function given to transaction() and await it',
      );
    }
    // A client whose statement timed out (query_timeout) is still busy with it: a statement sent
    // now would wait behind it for another timeout. Refused at once instead, with the first error.
    if (this.broken) throw this.broken;
  }

  /**
   * Sends `BEGIN` (the first time), the deferred statements and `steps` in one round trip, and
   * resolves with the results of `steps`. Queued on the client at once (before anything the
   * client's holder sends after this call) unless a round trip is in flight: then once it ended.
   * `BEGIN` always goes at once, with the first round trip.
   */
  private async send(steps: readonly PipelineStep[]): Promise<QueryResult[]> {
    const head = this.begun ? [] : [BEGIN];
    this.begun = true;
    const deferred = this.deferred;
    this.deferred = [];
    const all = [...head, ...deferred.map((entry) => entry.step), ...steps];
    const handedOut = this.handedOut;
    this.handedOut = undefined;
    const sending = all.length > 0 ? this.afterInFlight(all) : Promise.resolve([]);
    let results: QueryResult[];
    try {
      await handedOut;
      results = await sending;
    } catch (error) {
      sending.catch(() => undefined);
      if (isConnectionError(error)) this.broken ??= error as Error;
      const step = failedStepOf(error);
      if (step !== undefined && step >= head.length && step < head.length + deferred.length) {
        DEFERRED_FAILURES.add(error as object);
      }
      throw error;
    }
    deferred.forEach((entry, index) => entry.onResult?.(results[head.length + index]));
    return results.slice(head.length + deferred.length);
  }

  /** Sends `steps` at once, or once the round trip in flight has ended. */
  private afterInFlight(steps: readonly PipelineStep[]): Promise<QueryResult[]> {
    const before = this.inFlight;
    const sending = before
      ? before.then(() => {
          if (this.broken) throw this.broken;
          return runPipeline(this.connection, steps);
        })
      : runPipeline(this.connection, steps);
    const ended = sending.then(
      () => undefined,
      () => undefined,
    );
    this.inFlight = ended;
    void ended.then(() => {
      if (this.inFlight === ended) this.inFlight = undefined;
    });
    return sending;
  }

  /**
   * Commits (with the deferred statements, in one round trip); resolves with the command
   * PostgreSQL answered (`ROLLBACK` for a transaction a failed statement aborted). A transaction
   * that sent nothing has nothing to commit.
   */
  async commit(): Promise<string> {
    // A statement outran query_timeout: the client is still busy with it; refused as a statement.
    if (this.broken) throw this.broken;
    if (!this.begun && this.deferred.length === 0) return 'COMMIT';
    const results = await this.send([COMMIT]);
    return results[0].command;
  }

  /** Rolls back what was sent (the deferred statements are dropped). */
  async rollback(): Promise<void> {
    this.deferred = [];
    this.handedOut = undefined;
    if (!this.begun) return;
    // Queued after every step sent before: one queued behind the ROLLBACK (a deferred append
    // going step by step) would run outside the transaction, and commit on its own.
    await this.inFlight;
    if (this.broken) throw this.broken;
    await this.connection.query('ROLLBACK');
  }

  async savepoint<T>(work: () => Promise<T>): Promise<T> {
    const name = `sp_${++this.savepoints}`;
    // In effect from now: a rollback to an enclosing one sent meanwhile ends it too.
    this.inEffect.push(name);
    try {
      await this.query(`SAVEPOINT ${name}`);
    } catch (error) {
      this.leave(name);
      throw error;
    }
    let result: T;
    try {
      result = await work();
    } catch (error) {
      // Ended by an enclosing rollback meanwhile: nothing left to roll back.
      if (!this.leave(name)) throw error;
      // When the connection is gone this fails too; the work's error is the one worth seeing.
      await this.query(`ROLLBACK TO SAVEPOINT ${name}`).catch(() => undefined);
      throw error;
    }
    const innermost = this.inEffect.at(-1);
    if (!this.leave(name)) throw new SavepointEndedError(name);
    if (innermost !== name) {
      // A savepoint opened inside this one is still in effect (a nested transaction not awaited):
      // RELEASE would fold its writes so far into this one's. Both are rolled back instead.
      await this.query(`ROLLBACK TO SAVEPOINT ${name}`).catch(() => undefined);
      throw new NestedTransactionOpenError(innermost!, `savepoint ${name}`);
    }
    try {
      await this.query(`RELEASE SAVEPOINT ${name}`);
    } catch (error) {
      // A statement deferred inside the work, sent with the RELEASE, failed: its own error.
      // Otherwise the work swallowed an error of its own statements: the transaction is aborted,
      // and only rolling back to the savepoint makes it usable again. Its work is then void: say so.
      await this.query(`ROLLBACK TO SAVEPOINT ${name}`).catch(() => undefined);
      if (DEFERRED_FAILURES.has(error as object)) throw error;
      throw new PostgresOutboxError(
        'savepoint',
        `the work inside savepoint ${name} left the transaction aborted (a failed statement ` +
          `whose error was caught), so what it wrote was rolled back: ${errorMessage(error)}`,
      );
    }
    return result;
  }

  /**
   * Throws NestedTransactionOpenError when a savepoint opened in this transaction is still in
   * effect: a nested transaction() left running (not awaited), whose writes so far COMMIT would
   * keep whatever it does next. Its savepoints end here, with the transaction, which the caller
   * rolls back; their work, when it ends, rejects.
   */
  assertSavepointsEnded(): void {
    const open = this.inEffect[0];
    if (open === undefined) return;
    this.inEffect.length = 0;
    throw new NestedTransactionOpenError(open);
  }

  /**
   * Takes `name` and the savepoints inside it out of effect (a `RELEASE` or `ROLLBACK TO` of it
   * is about to end them); false when an enclosing rollback already did.
   */
  private leave(name: string): boolean {
    const at = this.inEffect.lastIndexOf(name);
    if (at < 0) return false;
    this.inEffect.splice(at);
    return true;
  }

  /** Whether the transaction has committed or rolled back. */
  get isSettled(): boolean {
    return this.settled;
  }

  /** After COMMIT or ROLLBACK: the client may serve someone else from now on. */
  settle(): void {
    this.settled = true;
    // Ended with it: the work of one left running rejects when it ends (SavepointEndedError).
    this.inEffect.length = 0;
  }
}

/**
 * Runs `work` in a new transaction on a client of `pool`: COMMIT when it resolves, ROLLBACK (and
 * the error rethrown) when it throws. The client goes back to the pool afterwards, unless its
 * connection failed (killed, network): then it is destroyed, so that the pool never hands out a
 * broken client or one still inside a transaction.
 */
export async function inTransaction<T>(
  pool: Pool,
  work: (transaction: PostgresStoreTransaction) => Promise<T>,
): Promise<T> {
  let broken: Error | undefined;
  // A checked-out pg client has no 'error' listener: a connection dropped between two
  // statements would otherwise be an uncaught 'error' event that ends the process.
  const onError = (error: Error): void => {
    broken ??= error;
  };
  const client = await checkOut(pool, onError);
  const transaction = new PostgresStoreTransaction(client);
  try {
    const result = await work(transaction);
    // Settled before COMMIT is sent: a statement a stray callback sends through the transaction
    // from now on is refused, rather than queued behind the COMMIT and run outside it.
    transaction.settle();
    // The connection failed meanwhile (even with nothing sent yet), or a statement outran
    // query_timeout and the work caught its error: nothing more goes on it, and nothing of the
    // transaction commits (queued behind that statement, a COMMIT would commit it once it ends).
    broken ??= transaction.brokenBy;
    if (broken) throw broken;
    const committed = await transaction.commit();
    // A statement failed inside and its error was caught: PostgreSQL has aborted the transaction
    // and answers COMMIT with ROLLBACK, without an error. Nothing was written; say so.
    if (committed !== 'COMMIT') {
      throw new PostgresOutboxError(
        'transaction',
        `PostgreSQL rolled the transaction back instead of committing it (it answered ` +
          `${committed}): a statement in it failed and its error was caught, which ` +
          'aborts a PostgreSQL transaction. Nothing of it was written; let such errors ' +
          'propagate, or run a statement that may fail inside tx.savepoint()',
      );
    }
    return result;
  } catch (error) {
    transaction.settle();
    if (isConnectionError(error)) broken ??= error as Error;
    // The work may have caught that error and thrown one of its own: the client is still busy
    // with the statement, so a ROLLBACK would wait a second query_timeout behind it.
    broken ??= transaction.brokenBy;
    if (!broken) {
      try {
        await transaction.rollback();
      } catch (rollbackError) {
        broken = rollbackError as Error;
      }
    }
    throw error;
  } finally {
    transaction.settle();
    client.removeListener('error', onError);
    client.release(broken ?? false);
  }
}

/**
 * SQLSTATE classes of errors the server may answer a COMMIT with that say nothing about what the
 * transaction did: insufficient resources (53), a program limit (54), an operator's intervention
 * (57: a cancel, a shutdown), a system (58) or internal (XX) error, a connection exception (08).
 */
const NOT_A_REFUSAL = /^(08|53|54|57|58|XX)/;

/**
 * Whether the server refused a COMMIT for what the transaction did (a deferred constraint or
 * constraint trigger it broke, a serialization failure): an error the server answered for the
 * COMMIT itself, not for a statement deferred to go with it, nor the connection's.
 */
export function isCommitRefusal(error: unknown): boolean {
  if (error === null || typeof error !== 'object' || DEFERRED_FAILURES.has(error)) return false;
  const code = (error as { code?: unknown }).code;
  return (
    typeof code === 'string' &&
    /^[0-9A-Z]{5}$/.test(code) &&
    !NOT_A_REFUSAL.test(code) &&
    !isConnectionError(error)
  );
}

/** Errors of deferred statements (see `defer`), which a savepoint's RELEASE then reports. */
const DEFERRED_FAILURES = new WeakSet<object>();

const statementNames = new Map<string, string>();

/** `nseq_<hash of the text>`: one name per text, on every connection and in every store. */
function statementName(sql: string): string {
  let name = statementNames.get(sql);
  if (!name) {
    name = `nseq_${createHash('sha256').update(sql).digest('hex').slice(0, 24)}`;
    statementNames.set(sql, name);
  }
  return name;
}

/**
 * `connection` as a holder of the transaction may use it: every property and method of the `pg`
 * client but `release`, which throws. A `release()` out of habit (`pool.connect()` code) would
 * hand the connection to the pool's next taker in the middle of this transaction, its COMMIT or
 * ROLLBACK then ending that taker's work, and make the outbox's own release fail.
 */
function guarded(connection: PoolClient): PoolClient {
  const known = guardedClients.get(connection);
  if (known) return known;
  const refuse = (): never => {
    throw new Error(
      "tx.client is the transaction's connection: it goes back to the pool when the " +
        'transaction ends; do not release it',
    );
  };
  // One bound function per method, as long as the connection's own is the same function.
  const bound = new WeakMap<object, unknown>();
  const proxy = new Proxy(connection, {
    get(target, property) {
      if (property === 'release') return refuse;
      const value: unknown = Reflect.get(target, property, target);
      if (typeof value !== 'function') return value;
      // Called on the client itself: pg keeps its state on it, not on a proxy.
      let method = bound.get(value);
      if (!method) {
        method = (value as (...args: unknown[]) => unknown).bind(target);
        bound.set(value, method);
      }
      return method;
    },
  });
  guardedClients.set(connection, proxy);
  return proxy;
}

/** The guarded client of each pooled connection: one object per connection, across transactions. */
const guardedClients = new WeakMap<PoolClient, PoolClient>();
