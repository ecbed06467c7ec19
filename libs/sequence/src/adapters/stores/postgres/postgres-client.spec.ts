import { EventEmitter } from 'node:events';
import { Pool } from 'pg';
import { migrateOutbox } from './postgres-migrations';
import { inTransaction } from './postgres.store-transaction';

type Callback = (error: Error | null, result?: unknown) => void;

/**
 * A pg client as pg-pool sees it, whose statements the test answers by hand: it stands in for a
 * server whose one socket read carries a statement's reply and, right behind it, a FATAL error.
 */
class ScriptedClient extends EventEmitter {
  static created: ScriptedClient[] = [];
  _queryable = true;
  _ending = false;
  readonly pending: Array<{ text: string; callback: Callback }> = [];

  constructor() {
    super();
    ScriptedClient.created.push(this);
  }

  connect(callback: Callback): void {
    setImmediate(() => callback(null));
  }

  query(config: string | { text: string }, values?: unknown, callback?: Callback): unknown {
    const text = typeof config === 'string' ? config : config.text;
    const done = typeof values === 'function' ? (values as Callback) : callback;
    if (!this._queryable) {
      const error = new Error('Client has encountered a connection error and is not queryable');
      if (done) setImmediate(() => done(error));
      return done ? undefined : Promise.reject(error);
    }
    if (done) {
      this.pending.push({ text, callback: done });
      return undefined;
    }
    return new Promise((resolve, reject) => {
      this.pending.push({
        text,
        callback: (error, result) => (error ? reject(error) : resolve(result)),
      });
    });
  }

  /** What pg does when the server's FATAL arrives with no statement running. */
  fail(error: Error): void {
    this._queryable = false;
    this.emit('error', error);
  }

  end(callback?: () => void): Promise<void> | void {
    this._ending = true;
    if (callback) return void setImmediate(callback);
    return Promise.resolve();
  }
}

const administratorCommand = (): Error =>
  Object.assign(new Error('terminating connection due to administrator command'), {
    code: '57P01',
  });

async function until(condition: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !condition(); i++) await new Promise((r) => setImmediate(r));
  if (!condition()) throw new Error('condition not reached');
}

describe('checking out a pool client', () => {
  let pool: Pool;

  beforeEach(() => {
    ScriptedClient.created = [];
    pool = new Pool({ max: 1, Client: ScriptedClient as unknown as typeof import('pg').Client });
    pool.on('error', () => undefined);
  });

  afterEach(async () => {
    await pool.end().catch(() => undefined);
  });

  /**
   * The pool's only client serves a `pool.query`; `take` waits for it. The reply to that query is
   * handed over, and in the same synchronous turn (as pg parses one socket read) the server's
   * FATAL follows: pg-pool has passed the client to `take` in between.
   */
  async function failRightAfterHandOver(take: () => Promise<unknown>): Promise<unknown> {
    const first = pool.query('SELECT 1');
    await until(() => ScriptedClient.created[0]?.pending.length === 1);
    const client = ScriptedClient.created[0];
    const taking = take().then(
      (value) => ({ value }),
      (error: unknown) => ({ error }),
    );
    await until(() => (pool as unknown as { _pendingQueue: unknown[] })._pendingQueue.length > 0);

    client.pending.shift()!.callback(null, { rows: [], rowCount: 0 });
    expect(() => client.fail(administratorCommand())).not.toThrow();

    await first;
    return taking;
  }

  it('inTransaction hears an error the server sends while the pool hands the client over', async () => {
    const outcome = await failRightAfterHandOver(() =>
      inTransaction(pool, () => Promise.resolve('done')),
    );

    expect(outcome).toMatchObject({ error: expect.any(Error) });
    // The broken client was destroyed, not put back in the pool.
    expect(ScriptedClient.created[0]._ending).toBe(true);
  });

  it('migrateOutbox hears it too', async () => {
    const outcome = await failRightAfterHandOver(() => migrateOutbox(pool));

    expect(outcome).toMatchObject({ error: expect.any(Error) });
    expect(ScriptedClient.created[0]._ending).toBe(true);
  });
});
