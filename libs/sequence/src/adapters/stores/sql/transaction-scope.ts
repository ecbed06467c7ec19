import { AsyncLocalStorage } from 'node:async_hooks';
import type { StoreTransaction } from '../../../ports/outbox-store.port';

/**
 * The transaction of one store that the current async context runs in, if any: so that a
 * `transaction()` inside another one's work (or inside a claim's handler) joins it as a savepoint
 * rather than opening a second one, which on SQLite's single connection would wait forever.
 *
 * Node (20) tracks async context for every promise the process creates while any
 * `AsyncLocalStorage` is enabled: about a tenth of a busy outbox relay's CPU. So the storage is
 * enabled only while a transaction of this scope runs, and disabled again when the last one
 * ends; what a context captured before that could still find is a finished transaction, which
 * {@link active} ignores anyway.
 */
export class TransactionScope {
  private readonly current = new AsyncLocalStorage<ScopeFrame>();
  /** Runs of {@link run} in progress; the storage is disabled whenever this falls to 0. */
  private running = 0;

  /** The transaction `work` is running in, when called from inside one of {@link run}. */
  active(): StoreTransaction | undefined {
    const frame = this.current.getStore();
    return frame && !frame.finished ? frame.transaction : undefined;
  }

  /**
   * Runs `work` with `transaction` as the active one for everything it awaits, until it settles.
   * Each run is a frame of its own: a run nested in another one (one inbox handler call inside
   * its claim's) ends for what was started inside it when it settles, while the transaction and
   * the enclosing run go on.
   */
  async run<T>(transaction: StoreTransaction, work: () => Promise<T>): Promise<T> {
    const frame: ScopeFrame = { transaction, finished: false };
    this.running++;
    try {
      return await this.current.run(frame, work);
    } finally {
      frame.finished = true;
      // The next run() enables it again.
      if (--this.running === 0) this.current.disable();
    }
  }

  /**
   * Runs `work` outside any transaction of this scope, whatever the caller's async context: for
   * the library's own steps (a relay's claim, an inbox insert before its ack), which must be
   * transactions of their own and never join one that the code that woke them happens to run in.
   */
  outside<T>(work: () => Promise<T>): Promise<T> {
    return this.current.exit(work);
  }

  /**
   * `work` in the active transaction (inside a savepoint), or, when there is none, in a new one
   * that `open` begins and settles.
   */
  join<T>(
    open: (work: (transaction: StoreTransaction) => Promise<T>) => Promise<T>,
    work: (transaction: StoreTransaction) => Promise<T>,
  ): Promise<T> {
    const active = this.active();
    if (active) return active.savepoint(() => work(active));
    return open((transaction) => this.run(transaction, () => work(transaction)));
  }
}

/**
 * One run of a transaction in a scope. A callback that outlives its run (a timer, a call not
 * awaited) still carries the frame in its async context: once the run is over it must open a new
 * transaction, not put a savepoint on a connection that went back to the pool, on a committed
 * one, or on a claim's transaction that has moved on to another record.
 */
interface ScopeFrame {
  readonly transaction: StoreTransaction;
  finished: boolean;
}
