import type { SqlExecutor } from '../../../ports/outbox-store.port';
import {
  BOX,
  claimAndComplete,
  record,
  type ExternalConnection,
  type OutboxSuiteContext,
} from './outbox-suite.context';

/**
 * `append` inside a transaction the caller opened on a connection of its own (PostgreSQL): the
 * records commit or roll back with the caller's transaction, not before.
 */
export function describeExternalTransactionCases(c: OutboxSuiteContext): void {
  describe("the caller's own transaction", () => {
    let connection: ExternalConnection | undefined;

    afterEach(async () => {
      await connection?.release();
      connection = undefined;
    });

    async function begin(): Promise<SqlExecutor> {
      connection = await c.externalConnection();
      await connection.executor.query('BEGIN');
      return connection.executor;
    }

    it('appends through the executor, nothing claimable before COMMIT and the records after', async () => {
      const executor = await begin();
      await expect(c.store.append(BOX, [record('external-1')], executor)).resolves.toEqual([
        'external-1',
      ]);

      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 })).resolves.toEqual([]);
      await expect(c.store.get(BOX, 'external-1')).resolves.toBeUndefined();

      await executor.query('COMMIT');
      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 })).resolves.toEqual([
        'external-1',
      ]);
    });

    it('never hands out what a rolled-back caller transaction appended', async () => {
      const executor = await begin();
      await c.store.append(BOX, [record('external-1')], executor);
      await executor.query('ROLLBACK');

      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 })).resolves.toEqual([]);
      await expect(c.store.get(BOX, 'external-1')).resolves.toBeUndefined();
    });

    it('returns only the ids added, the caller transaction seeing its own duplicates', async () => {
      const executor = await begin();
      const added = await c.store.append(
        BOX,
        [record('external-1'), record('external-2')],
        executor,
      );
      expect(added.sort()).toEqual(['external-1', 'external-2']);
      await expect(
        c.store.append(BOX, [record('external-2'), record('external-3')], executor),
      ).resolves.toEqual(['external-3']);
      await executor.query('COMMIT');

      await expect(
        claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 }).then((ids) => ids.sort()),
      ).resolves.toEqual(['external-1', 'external-2', 'external-3']);
    });

    it("accepts an executor whose query resolves with the rows themselves (TypeORM's shape)", async () => {
      const executor = await begin();
      const rowsOnly: SqlExecutor = {
        async query(text, values) {
          const result = (await executor.query(text, values)) as { rows?: unknown[] };
          return result.rows ?? result;
        },
      };
      await expect(c.store.append(BOX, [record('typeorm-1')], rowsOnly)).resolves.toEqual([
        'typeorm-1',
      ]);
      await expect(c.store.append(BOX, [record('typeorm-1')], rowsOnly)).resolves.toEqual([]);
      await executor.query('COMMIT');

      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 })).resolves.toEqual([
        'typeorm-1',
      ]);
    });
  });
}
