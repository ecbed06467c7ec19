import { NestedTransactionOpenError } from '../../../core/errors/nested-transaction-open.error';
import { SavepointEndedError } from '../../../core/errors/savepoint-ended.error';
import { BOX, claimAndComplete, record, type OutboxSuiteContext } from './outbox-suite.context';

/** A promise to wait for, and what resolves it. */
function gate(): { opened: Promise<void>; open: () => void } {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { opened, open };
}

/** `transaction`: commit, rollback, nesting as a savepoint, and `tx.savepoint`. */
export function describeTransactionCases(c: OutboxSuiteContext): void {
  describe('transaction', () => {
    it('resolves with what work returns, and exposes the store dialect', async () => {
      await expect(
        c.store.transaction(async (tx) => {
          expect(tx.dialect).toBe(c.store.dialect);
          return 42;
        }),
      ).resolves.toBe(42);
    });

    it('commits the business row and the appended records together', async () => {
      const table = await c.businessTable();
      await c.store.transaction(async (tx) => {
        await table.insert(tx, 'order-1', 'placed');
        await c.store.append(BOX, [record('placed-1')], tx);
      });

      await expect(table.read('order-1')).resolves.toBe('placed');
      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 })).resolves.toEqual([
        'placed-1',
      ]);
    });

    it('rolls back the business row and the appended records when work throws, rethrowing', async () => {
      const table = await c.businessTable();
      const boom = new Error('business rule broken');
      await expect(
        c.store.transaction(async (tx) => {
          await table.insert(tx, 'order-1', 'placed');
          await c.store.append(BOX, [record('placed-1')], tx);
          throw boom;
        }),
      ).rejects.toBe(boom);

      await expect(table.read('order-1')).resolves.toBeUndefined();
      await expect(c.store.get(BOX, 'placed-1')).resolves.toBeUndefined();
      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 })).resolves.toEqual([]);
    });

    it('leaves the store usable after a rollback', async () => {
      await expect(
        c.store.transaction(async () => {
          throw new Error('first attempt fails');
        }),
      ).rejects.toThrow('first attempt fails');
      await c.store.transaction((tx) => c.store.append(BOX, [record('second')], tx));
      await expect(c.store.get(BOX, 'second')).resolves.toMatchObject({ status: 'PENDING' });
    });

    it('joins a transaction started inside work as a savepoint: an inner throw caught outside undoes only the inner writes', async () => {
      const table = await c.businessTable();
      await c.store.transaction(async (outer) => {
        await table.insert(outer, 'outer', 'kept');
        await c.store.append(BOX, [record('outer-record')], outer);
        await expect(
          c.store.transaction(async (inner) => {
            await table.insert(inner, 'inner', 'undone');
            await c.store.append(BOX, [record('inner-record')], inner);
            throw new Error('inner fails');
          }),
        ).rejects.toThrow('inner fails');
      });

      await expect(table.read('outer')).resolves.toBe('kept');
      await expect(table.read('inner')).resolves.toBeUndefined();
      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 })).resolves.toEqual([
        'outer-record',
      ]);
    });

    it('commits a nested transaction only with the outer one: an outer throw undoes both', async () => {
      const table = await c.businessTable();
      await expect(
        c.store.transaction(async (outer) => {
          await table.insert(outer, 'outer', 'undone');
          await c.store.transaction(async (inner) => {
            await table.insert(inner, 'inner', 'undone');
            await c.store.append(BOX, [record('inner-record')], inner);
          });
          throw new Error('outer fails after the inner one resolved');
        }),
      ).rejects.toThrow('outer fails');

      await expect(table.read('outer')).resolves.toBeUndefined();
      await expect(table.read('inner')).resolves.toBeUndefined();
      await expect(c.store.get(BOX, 'inner-record')).resolves.toBeUndefined();
    });

    it('commits what a nested transaction wrote when both resolve', async () => {
      const table = await c.businessTable();
      await c.store.transaction(async () => {
        await c.store.transaction((inner) => table.insert(inner, 'inner', 'kept'));
      });
      await expect(table.read('inner')).resolves.toBe('kept');
    });

    it('savepoint: rolls back what work wrote when it throws, rethrowing, and the transaction goes on', async () => {
      const table = await c.businessTable();
      const boom = new Error('savepoint work fails');
      await c.store.transaction(async (tx) => {
        await table.insert(tx, 'before', 'kept');
        await expect(
          tx.savepoint(async () => {
            await table.insert(tx, 'inside', 'undone');
            await c.store.append(BOX, [record('inside-record')], tx);
            throw boom;
          }),
        ).rejects.toBe(boom);
        await table.insert(tx, 'after', 'kept');
        await c.store.append(BOX, [record('after-record')], tx);
      });

      await expect(table.read('before')).resolves.toBe('kept');
      await expect(table.read('inside')).resolves.toBeUndefined();
      await expect(table.read('after')).resolves.toBe('kept');
      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 })).resolves.toEqual([
        'after-record',
      ]);
    });

    it('savepoint: keeps what work wrote when it resolves, resolving with its value', async () => {
      const table = await c.businessTable();
      await c.store.transaction(async (tx) => {
        await expect(
          tx.savepoint(async () => {
            await table.insert(tx, 'inside', 'kept');
            return 'done';
          }),
        ).resolves.toBe('done');
      });
      await expect(table.read('inside')).resolves.toBe('kept');
    });

    it('savepoint: nests, an inner rollback leaving the outer savepoint intact', async () => {
      const table = await c.businessTable();
      await c.store.transaction(async (tx) => {
        await tx.savepoint(async () => {
          await table.insert(tx, 'outer-savepoint', 'kept');
          await expect(
            tx.savepoint(async () => {
              await table.insert(tx, 'inner-savepoint', 'undone');
              throw new Error('inner savepoint fails');
            }),
          ).rejects.toThrow('inner savepoint fails');
        });
      });
      await expect(table.read('outer-savepoint')).resolves.toBe('kept');
      await expect(table.read('inner-savepoint')).resolves.toBeUndefined();
    });

    it('savepoint: one an enclosing rollback ended while it ran sends nothing more, and rejects', async () => {
      const table = await c.businessTable();
      let innerStarted!: () => void;
      const started = new Promise<void>((resolve) => (innerStarted = resolve));
      let innerGo!: () => void;
      const go = new Promise<void>((resolve) => (innerGo = resolve));
      await c.store.transaction(async (tx) => {
        let inner: Promise<unknown> | undefined;
        // The outer savepoint fails while the inner one, not awaited, still runs (an inbox
        // handler call past its time limit, rolled back by its claim).
        await expect(
          tx.savepoint(async () => {
            inner = tx.savepoint(async () => {
              await table.insert(tx, 'inner', 'undone');
              innerStarted();
              await go;
            });
            await started;
            throw new Error('outer savepoint fails');
          }),
        ).rejects.toThrow('outer savepoint fails');
        innerGo();
        await expect(inner).rejects.toThrow(SavepointEndedError);
        // The transaction was not aborted by a statement about the ended savepoint.
        await table.insert(tx, 'after', 'kept');
      });
      await expect(table.read('inner')).resolves.toBeUndefined();
      await expect(table.read('after')).resolves.toBe('kept');
    });

    it('rolls back a transaction whose work returned while a nested one was still open, and both reject', async () => {
      const table = await c.businessTable();
      let nested: Promise<unknown> | undefined;
      const wrote = gate();
      const go = gate();
      await expect(
        c.store.transaction(async (outer) => {
          await table.insert(outer, 'outer', 'undone');
          // Not awaited: still open when this work returns. A COMMIT now would keep what it
          // wrote so far, whatever it does next.
          nested = c.store.transaction(async (inner) => {
            await table.insert(inner, 'nested', 'undone');
            await c.store.append(BOX, [record('nested-record')], inner);
            wrote.open();
            await go.opened;
          });
          nested.catch(() => undefined);
          await wrote.opened;
        }),
      ).rejects.toThrow(NestedTransactionOpenError);
      go.open();
      await expect(nested).rejects.toThrow(SavepointEndedError);

      for (const id of ['outer', 'nested']) {
        await expect(table.read(id)).resolves.toBeUndefined();
      }
      await expect(c.store.get(BOX, 'nested-record')).resolves.toBeUndefined();
      // The store goes on: the next transaction, with a nested one of its own, commits.
      await c.store.transaction(async () => {
        await c.store.transaction((inner) => table.insert(inner, 'next', 'kept'));
      });
      await expect(table.read('next')).resolves.toBe('kept');
    });

    it('rolls back a nested transaction that returned while one it started was still open; the outer one goes on', async () => {
      const table = await c.businessTable();
      let innermost: Promise<unknown> | undefined;
      const wrote = gate();
      const go = gate();
      await c.store.transaction(async (outer) => {
        await table.insert(outer, 'outer', 'kept');
        await expect(
          c.store.transaction(async (nested) => {
            await table.insert(nested, 'nested', 'undone');
            // Not awaited: still open when this nested work returns.
            innermost = c.store.transaction(async (inner) => {
              await table.insert(inner, 'innermost', 'undone');
              await c.store.append(BOX, [record('innermost-record')], inner);
              wrote.open();
              await go.opened;
            });
            innermost.catch(() => undefined);
            await wrote.opened;
          }),
        ).rejects.toThrow(NestedTransactionOpenError);
        go.open();
        await expect(innermost).rejects.toThrow(SavepointEndedError);
        await table.insert(outer, 'after', 'kept');
      });

      await expect(table.read('outer')).resolves.toBe('kept');
      await expect(table.read('after')).resolves.toBe('kept');
      await expect(table.read('nested')).resolves.toBeUndefined();
      await expect(table.read('innermost')).resolves.toBeUndefined();
      await expect(c.store.get(BOX, 'innermost-record')).resolves.toBeUndefined();
    });

    it('rejects a nested transaction left running that resolves after the outer one rolled back', async () => {
      const table = await c.businessTable();
      let nested: Promise<unknown> | undefined;
      const wrote = gate();
      const go = gate();
      await expect(
        c.store.transaction(async () => {
          nested = c.store.transaction(async (inner) => {
            await table.insert(inner, 'nested', 'undone');
            wrote.open();
            await go.opened;
            return 'done';
          });
          nested.catch(() => undefined);
          await wrote.opened;
          throw new Error('outer fails');
        }),
      ).rejects.toThrow('outer fails');
      go.open();

      // Its writes went with the rollback: it must not report success.
      await expect(nested).rejects.toThrow(SavepointEndedError);
      await expect(table.read('nested')).resolves.toBeUndefined();
    });

    it('runs a query, reporting the rows read, or the rows changed as rowCount', async () => {
      const table = await c.businessTable();
      const [updated, selected] = await c.store.transaction(async (tx) => {
        await table.insert(tx, 'a', 'one');
        await table.insert(tx, 'b', 'two');
        await table.insert(tx, 'c', 'three');
        return [
          await tx.query(`UPDATE ${table.name} SET value = value WHERE id <> 'c'`),
          await tx.query<{ id: string; value: string }>(
            `SELECT id, value FROM ${table.name} ORDER BY id`,
          ),
        ] as const;
      });
      expect(updated.rowCount).toBe(2);
      expect(selected.rows).toEqual([
        { id: 'a', value: 'one' },
        { id: 'b', value: 'two' },
        { id: 'c', value: 'three' },
      ]);
    });
  });
}
