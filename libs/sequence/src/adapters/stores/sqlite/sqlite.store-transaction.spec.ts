import Database from 'better-sqlite3';
import { NestedTransactionOpenError } from '../../../core/errors/nested-transaction-open.error';
import type { NewBoxRecord } from '../../../ports/outbox-store.port';
import { SqliteOutboxError } from './sqlite-outbox.error';
import { SqliteStatementCache } from './sqlite-statement.cache';
import { SqliteOutboxStore } from './sqlite.outbox-store';

const BOX = 'outbox_events';

function record(id: string): NewBoxRecord {
  return { id, kind: 'event', type: 'OrderPlaced', partitionKey: null, body: '{}', headers: {} };
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

describe('SqliteOutboxStore transactions', () => {
  let store: SqliteOutboxStore;

  beforeEach(async () => {
    store = await SqliteOutboxStore.open({ filename: ':memory:' });
    await store.migrate();
    await store.transaction((tx) =>
      tx.query('CREATE TABLE business (id TEXT PRIMARY KEY, value TEXT)'),
    );
  });

  afterEach(async () => {
    await store.close();
  });

  async function seqOf(id: string): Promise<number> {
    const stored = await store.get(BOX, id);
    if (!stored) throw new Error(`${id} was not appended`);
    return stored.seq;
  }

  it('runs transactions that async callers start at once one after the other, in call order', async () => {
    await Promise.all(
      Array.from({ length: 20 }, (_, index) =>
        store.transaction(async (tx) => {
          await store.append(BOX, [record(`t${index}-a`)], tx);
          // Across turns of the event loop: a second BEGIN here would fail on one connection.
          await sleep(1);
          await store.append(BOX, [record(`t${index}-b`)], tx);
        }),
      ),
    );
    const seqs = await Promise.all(
      Array.from({ length: 20 }, async (_, index) => [
        await seqOf(`t${index}-a`),
        await seqOf(`t${index}-b`),
      ]),
    );
    // Never interleaved (each one's two records are adjacent), first come first served.
    expect(seqs).toEqual(Array.from({ length: 20 }, (_, index) => [2 * index + 1, 2 * index + 2]));
  });

  it('answers rows for statements that return them, and changed rows for the others', async () => {
    await store.transaction(async (tx) => {
      await expect(
        tx.query('INSERT INTO business (id, value) VALUES (?, ?), (?, ?)', ['a', '1', 'b', '2']),
      ).resolves.toEqual({
        rows: [],
        rowCount: 2,
      });
      await expect(tx.query('SELECT id, value FROM business ORDER BY id')).resolves.toEqual({
        rows: [
          { id: 'a', value: '1' },
          { id: 'b', value: '2' },
        ],
        rowCount: 2,
      });
      await expect(
        tx.query("UPDATE business SET value = value || '!' WHERE id = ? RETURNING value", ['a']),
      ).resolves.toEqual({ rows: [{ value: '1!' }], rowCount: 1 });
      await expect(tx.query('DELETE FROM business WHERE id = ?', ['none'])).resolves.toEqual({
        rows: [],
        rowCount: 0,
      });
    });
  });

  it('gives the better-sqlite3 Database as the client, inside BEGIN IMMEDIATE', async () => {
    await store.transaction(async (tx) => {
      const database = tx.client as Database.Database;
      expect(database).toBeInstanceOf(Database);
      expect(database.inTransaction).toBe(true);
    });
  });

  it('opens a new transaction for a callback that outlived the one it was started in', async () => {
    let later!: Promise<void>;
    await store.transaction(async () => {
      later = new Promise<void>((resolve, reject) =>
        setTimeout(() => {
          store
            .transaction((tx) => tx.query("INSERT INTO business (id, value) VALUES ('late', 'x')"))
            .then(() => resolve(), reject);
        }, 5),
      );
    });
    await later;
    const rows = await store.transaction((tx) =>
      tx.query("SELECT value FROM business WHERE id = 'late'"),
    );
    expect(rows.rows).toEqual([{ value: 'x' }]);
  });

  it('refuses savepoints run side by side in one transaction, rolling the transaction back', async () => {
    await expect(
      store.transaction(async (tx) => {
        await tx.query("INSERT INTO business (id, value) VALUES ('outer', 'x')");
        await Promise.all([
          tx.savepoint(async () => sleep(5)),
          tx.savepoint(async () => sleep(20)),
        ]);
      }),
    ).rejects.toThrow(NestedTransactionOpenError);
    const rows = await store.transaction((tx) => tx.query('SELECT id FROM business'));
    expect(rows.rowCount).toBe(0);
  });

  it('rolls back a savepoint refused beside another, when the transaction commits anyway', async () => {
    const outcomes = await store.transaction(async (tx) => {
      await tx.query("INSERT INTO business (id, value) VALUES ('outer', 'x')");
      return Promise.allSettled([
        tx.savepoint(async () => {
          await store.append(BOX, [record('first-side')], tx);
          await tx.query("INSERT INTO business (id, value) VALUES ('first-side', 'x')");
          await sleep(5);
        }),
        tx.savepoint(async () => {
          await tx.query("INSERT INTO business (id, value) VALUES ('second-side', 'x')");
          await sleep(20);
        }),
      ]);
    });
    // The first is refused (the second is open inside it) and undone with the second, which
    // then rejects too: the commit keeps only what ran outside both.
    expect(outcomes.map((outcome) => outcome.status)).toEqual(['rejected', 'rejected']);
    expect(String((outcomes[0] as PromiseRejectedResult).reason)).toMatch(
      /^NestedTransactionOpenError: /,
    );
    const rows = await store.transaction((tx) => tx.query('SELECT id FROM business ORDER BY id'));
    expect(rows.rows).toEqual([{ id: 'outer' }]);
    expect(await store.get(BOX, 'first-side')).toBeUndefined();
  });

  it('leaves the next transaction alone when a savepoint left running ends after its own', async () => {
    let left!: Promise<unknown>;
    await expect(
      store.transaction(async () => {
        // Not awaited: it is still running when this transaction rolls back.
        left = store.transaction(async (tx) => {
          await tx.query("INSERT INTO business (id, value) VALUES ('left', 'x')");
          await sleep(30);
          throw new Error('left running fails');
        });
        left.catch(() => undefined);
        await sleep(5);
        throw new Error('outer fails');
      }),
    ).rejects.toThrow('outer fails');
    // Its savepoint has the name this one's nested transaction takes: the first of its transaction.
    await store.transaction(async (tx) => {
      await tx.query("INSERT INTO business (id, value) VALUES ('next', 'x')");
      await store.transaction(async (nested) => {
        await nested.query("INSERT INTO business (id, value) VALUES ('next-nested', 'x')");
        await sleep(60);
      });
    });
    await expect(left).rejects.toThrow('left running fails');
    const rows = await store.transaction((tx) => tx.query('SELECT id FROM business ORDER BY id'));
    expect(rows.rows).toEqual([{ id: 'next' }, { id: 'next-nested' }]);
  });

  it('reports a transaction whose work sent COMMIT itself as failed', async () => {
    await expect(
      store.transaction(async (tx) => {
        await tx.query("INSERT INTO business (id, value) VALUES ('early', 'x')");
        await tx.query('COMMIT');
      }),
    ).rejects.toThrow(/ended before its work resolved/);
    await expect(
      store.transaction(async (tx) => {
        await tx.query('ROLLBACK');
      }),
    ).rejects.toBeInstanceOf(SqliteOutboxError);
    // The connection is usable afterwards.
    await expect(store.transaction(async () => 'fine')).resolves.toBe('fine');
  });

  it('refuses, with SqliteOutboxError, a statement after the transaction was ended under its work', async () => {
    let refused: unknown;
    await store
      .transaction(async (tx) => {
        await tx.query('ROLLBACK');
        refused = await tx.query('SELECT 1').catch((error: unknown) => error);
      })
      .catch(() => undefined);
    expect(refused).toBeInstanceOf(SqliteOutboxError);
    expect(refused).toMatchObject({ message: expect.stringMatching(/ended early/) });
  });

  describe('with an iterator of tx.client left open (no statement runs on the connection meanwhile)', () => {
    /** Starts iterating the business table (not empty) through the Database, and leaves it open. */
    function leaveIteratorOpen(client: unknown): IterableIterator<unknown> {
      const iterator = (client as Database.Database).prepare('SELECT id FROM business').iterate();
      iterator.next();
      return iterator;
    }

    it.each([
      ['throws', true],
      ['resolves (its COMMIT fails)', false],
    ])(
      'rejects a transaction whose work %s, and rolls it back once the iterator is closed',
      async (_what, throws) => {
        let iterator: IterableIterator<unknown> | undefined;
        const failed = store.transaction(async (tx) => {
          await tx.query("INSERT INTO business (id, value) VALUES ('undone', 'x')");
          await store.append(BOX, [record('undone-record')], tx);
          iterator = leaveIteratorOpen(tx.client);
          if (throws) throw new Error('work fails');
        });
        await expect(failed).rejects.toThrow(throws ? 'work fails' : /busy executing a query/);
        iterator!.return!();
        // The store goes on, without what the failed transaction wrote.
        await store.transaction((tx) =>
          tx.query("INSERT INTO business (id, value) VALUES ('next', 'y')"),
        );
        await expect(store.get(BOX, 'undone-record')).resolves.toBeUndefined();
        const rows = await store.transaction((tx) => tx.query('SELECT id FROM business'));
        expect(rows.rows).toEqual([{ id: 'next' }]);
      },
    );

    it('never commits what a nested transaction that threw wrote, when its rollback was refused', async () => {
      let iterator: IterableIterator<unknown> | undefined;
      const committed = store.transaction(async (outer) => {
        await outer.query("INSERT INTO business (id, value) VALUES ('outer', 'x')");
        await expect(
          store.transaction(async (inner) => {
            await inner.query("INSERT INTO business (id, value) VALUES ('nested', 'undone')");
            iterator = leaveIteratorOpen(inner.client);
            throw new Error('nested fails');
          }),
        ).rejects.toThrow('nested fails');
        // The caller goes on, as after a nested transaction that rolled back.
        iterator!.return!();
        await outer.query("INSERT INTO business (id, value) VALUES ('after', 'x')");
      });
      await expect(committed).rejects.toThrow(/could not be rolled back/);
      await expect(committed).rejects.toBeInstanceOf(SqliteOutboxError);
      const rows = await store.transaction((tx) => tx.query('SELECT id FROM business'));
      expect(rows.rows).toEqual([]);
    });

    it('reads nothing the failed transaction wrote once the iterator is closed', async () => {
      let iterator: IterableIterator<unknown> | undefined;
      await expect(
        store.transaction(async (tx) => {
          await tx.query("INSERT INTO business (id, value) VALUES ('undone', 'x')");
          await store.append(BOX, [record('undone-record')], tx);
          iterator = leaveIteratorOpen(tx.client);
          throw new Error('work fails');
        }),
      ).rejects.toThrow('work fails');
      iterator!.return!();
      await expect(store.get(BOX, 'undone-record')).resolves.toBeUndefined();
      await expect(store.stats(BOX)).resolves.toMatchObject({ pending: 0 });
    });
  });

  it('keeps the transaction going after a statement error that work catches', async () => {
    // Matched by code: better-sqlite3's native part makes its errors in the realm of the first
    // test file that loaded it, so in later files of a jest worker they fail `instanceof Error`.
    await store.transaction(async (tx) => {
      await tx.query("INSERT INTO business (id, value) VALUES ('one', 'x')");
      await expect(
        tx.query("INSERT INTO business (id, value) VALUES ('one', 'y')"),
      ).rejects.toMatchObject({ code: 'SQLITE_CONSTRAINT_PRIMARYKEY' });
      await store.append(BOX, [record('after-error')], tx);
    });
    await expect(store.get(BOX, 'after-error')).resolves.toMatchObject({ status: 'PENDING' });
  });
});

describe('SqliteStatementCache', () => {
  let database: Database.Database;

  beforeEach(() => {
    database = new Database(':memory:');
  });

  afterEach(() => {
    database.close();
  });

  it('prepares a SQL text once', () => {
    const cache = new SqliteStatementCache(database);
    expect(cache.get('SELECT 1')).toBe(cache.get('SELECT 1'));
  });

  it('keeps at most its capacity, dropping the least recently used', () => {
    const cache = new SqliteStatementCache(database, 2);
    const one = cache.get('SELECT 1');
    const two = cache.get('SELECT 2');
    cache.get('SELECT 1');
    cache.get('SELECT 3');
    expect(cache.size).toBe(2);
    expect(cache.get('SELECT 1')).toBe(one);
    expect(cache.get('SELECT 2')).not.toBe(two);
  });
});
