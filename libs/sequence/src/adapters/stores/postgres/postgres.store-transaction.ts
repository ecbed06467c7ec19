import { createHash } from 'node:crypto';
import type { BoxName } from '../../../ports/outbox-store.port';
import type { Pool, PoolClient } from 'pg';
import { PostgresOutboxError } from './postgres-outbox.error';
import type { StoreTransaction } from '../../../ports/outbox-store.port';
import { checkOut, isConnectionError } from './postgres-client';

/**
 * One open transaction on a pool client. Savepoints are numbered per transaction (`sp_1`,
 * `sp_2`, ...) so that nested ones never reuse a name. Savepoints of one transaction nest; two
 * started side by side (not awaited one after the other) would interleave on the single
 * connection, so nested transactions of one transaction run one at a time.
 */
export class PostgresStoreTransaction implements StoreTransaction {
  readonly dialect = 'postgres' as const;
  private savepoints = 0;
  private settled = false;
  /** Set when a statement found the connection gone or unusable: nothing more is sent on it. */
  private broken?: Error;
  /** Boxes appended to (or received into) in this transaction: announced after its commit. */
  readonly appended = new Set<BoxName>();

  constructor(readonly client: PoolClient) {}

  /** The error that made the connection unusable, if a statement met one (caught or not). */
  get brokenBy(): Error | undefined {
    return this.broken;
  }

  async query<Row = Record<string, unknown>>(
    sql: string,
    params: readonly unknown[] = [],
  ): Promise<{ rows: Row[]; rowCount: number }> {
    return this.run<Row>({ text: sql, values: params as unknown[] });
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
    return this.run<Row>({ name: statementName(sql), text: sql, values: params as unknown[] });
  }

  private async run<Row>(query: {
    name?: string;
    text: string;
    values: unknown[];
  }): Promise<{ rows: Row[]; rowCount: number }> {
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
    try {
      const result = await this.client.query(query);
      return { rows: result.rows as Row[], rowCount: result.rowCount ?? 0 };
    } catch (error) {
      if (isConnectionError(error)) this.broken ??= error as Error;
      throw error;
    }
  }

  async savepoint<T>(work: () => Promise<T>): Promise<T> {
    const name = `sp_${++this.savepoints}`;
    await this.query(`SAVEPOINT ${name}`);
    let result: T;
    try {
      result = await work();
    } catch (error) {
      // When the connection is gone this fails too; the work's error is the one worth seeing.
      await this.query(`ROLLBACK TO SAVEPOINT ${name}`).catch(() => undefined);
      throw error;
    }
    try {
      await this.query(`RELEASE SAVEPOINT ${name}`);
    } catch (error) {
      // The work swallowed an error of its own statements: the transaction is aborted, and only
      // rolling back to the savepoint makes it usable again. Its work is then void: say so.
      await this.query(`ROLLBACK TO SAVEPOINT ${name}`).catch(() => undefined);
      throw new PostgresOutboxError(
        'savepoint',
        `the work inside savepoint ${name} left the transaction aborted (a failed statement ` +
          `whose error was caught), so what it wrote was rolled back: ${(error as Error).message}`,
      );
    }
    return result;
  }

  /** Whether the transaction has committed or rolled back. */
  get isSettled(): boolean {
    return this.settled;
  }

  /** After COMMIT or ROLLBACK: the client may serve someone else from now on. */
  settle(): void {
    this.settled = true;
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
    await client.query('BEGIN');
    const result = await work(transaction);
    // Settled before COMMIT is sent: a statement a stray callback sends through the transaction
    // from now on is refused, rather than queued behind the COMMIT and run outside it.
    transaction.settle();
    const committed = await client.query('COMMIT');
    // A statement failed inside and its error was caught: PostgreSQL has aborted the transaction
    // and answers COMMIT with ROLLBACK, without an error. Nothing was written; say so.
    if (committed.command !== 'COMMIT') {
      throw new PostgresOutboxError(
        'transaction',
        `PostgreSQL rolled the transaction back instead of committing it (it answered ` +
          `${committed.command}): a statement in it failed and its error was caught, which ` +
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
        await client.query('ROLLBACK');
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
