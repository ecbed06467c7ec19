import { ClaimCommitRefusedError } from '../../../core/errors/claim-commit-refused.error';
import { NestedTransactionOpenError } from '../../../core/errors/nested-transaction-open.error';
import type { RecordOutcome } from '../../../ports/outbox-store.port';
import {
  appendCommitted,
  BOX,
  claimAndComplete,
  claimWith,
  completeAll,
  deferred,
  getAll,
  idsOf,
  placeholders,
  record,
  records,
  type OutboxSuiteContext,
} from './outbox-suite.context';

/** `claim`: what `handle` is given, the four outcomes, a throwing handler, the claim's transaction. */
export function describeClaimCases(c: OutboxSuiteContext): void {
  describe('claim', () => {
    const ids = ['r-1', 'r-2', 'r-3'];

    it('does not call handle when nothing is due, and says it claimed nothing', async () => {
      let called = false;
      const result = await c.store.claim(BOX, { limit: 10, now: c.t0 }, async (batch) => {
        called = true;
        return completeAll(batch);
      });
      expect(called).toBe(false);
      expect(result).toEqual({ claimed: 0, completed: 0, retried: 0, failed: 0 });
    });

    it('hands out the records as stored', async () => {
      await appendCommitted(c.store, BOX, records('r', 2));
      const stored = await getAll(c.store, BOX, ['r-1', 'r-2']);
      const { result } = await claimWith(c.store, BOX, { limit: 10, now: c.t0 }, (each) => {
        expect(each).toEqual(stored.find((one) => one.id === each.id));
        return { id: each.id, status: 'released' };
      });
      expect(result.claimed).toBe(2);
    });

    it('completed: COMPLETED at options.now, one attempt, never handed out again', async () => {
      await appendCommitted(c.store, BOX, records('r', 3));
      const now = c.t0 + 1_234;
      const result = await c.store.claim(BOX, { limit: 10, now }, async (batch) =>
        completeAll(batch),
      );
      expect(result).toEqual({ claimed: 3, completed: 3, retried: 0, failed: 0 });

      for (const stored of await getAll(c.store, BOX, ids)) {
        expect(stored).toMatchObject({ status: 'COMPLETED', attempts: 1, completedAt: now });
      }
      await expect(
        claimAndComplete(c.store, BOX, { limit: 10, now: now + 86_400_000 }),
      ).resolves.toEqual([]);
    });

    it('retry: PENDING with the error, one more attempt, not due before nextAttemptAt, due at it', async () => {
      await appendCommitted(c.store, BOX, [record('r-1')]);
      const retryAt = c.t0 + 60_000;
      const { result } = await claimWith(c.store, BOX, { limit: 10, now: c.t0 }, (each) => ({
        id: each.id,
        status: 'retry',
        nextAttemptAt: retryAt,
        error: 'broker unavailable',
      }));
      expect(result).toEqual({ claimed: 1, completed: 0, retried: 1, failed: 0 });
      await expect(c.store.get(BOX, 'r-1')).resolves.toMatchObject({
        status: 'PENDING',
        attempts: 1,
        nextAttemptAt: retryAt,
        lastError: 'broker unavailable',
        completedAt: null,
      });

      await expect(
        claimAndComplete(c.store, BOX, { limit: 10, now: retryAt - 1 }),
      ).resolves.toEqual([]);
      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: retryAt })).resolves.toEqual([
        'r-1',
      ]);
      await expect(c.store.get(BOX, 'r-1')).resolves.toMatchObject({
        status: 'COMPLETED',
        attempts: 2,
      });
    });

    it('retry: due at once when nextAttemptAt is past options.horizon (written on a clock ahead)', async () => {
      await appendCommitted(c.store, BOX, [record('r-1')]);
      const retryAt = c.t0 + 86_400_000;
      await claimWith(c.store, BOX, { limit: 10, now: c.t0 }, (each) => ({
        id: each.id,
        status: 'retry',
        nextAttemptAt: retryAt,
        error: 'refused',
      }));
      await expect(
        claimAndComplete(c.store, BOX, { limit: 10, now: c.t0, horizon: retryAt }),
      ).resolves.toEqual([]);
      await expect(
        claimAndComplete(c.store, BOX, { limit: 10, now: c.t0, horizon: retryAt - 1 }),
      ).resolves.toEqual(['r-1']);
    });

    it('retry: counts every attempt, keeping the latest error', async () => {
      await appendCommitted(c.store, BOX, [record('r-1')]);
      for (const attempt of [1, 2, 3]) {
        await claimWith(c.store, BOX, { limit: 10, now: c.t0 + attempt }, (each) => ({
          id: each.id,
          status: 'retry',
          nextAttemptAt: c.t0 + attempt + 1,
          error: `attempt ${attempt} failed`,
        }));
      }
      await expect(c.store.get(BOX, 'r-1')).resolves.toMatchObject({
        attempts: 3,
        lastError: 'attempt 3 failed',
      });
    });

    it('failed: FAILED with the error and one more attempt, never handed out again, listed as failed', async () => {
      await appendCommitted(c.store, BOX, [record('r-1'), record('r-2')]);
      const { result } = await claimWith(c.store, BOX, { limit: 1, now: c.t0 }, (each) => ({
        id: each.id,
        status: 'failed',
        error: 'poison message',
      }));
      expect(result).toEqual({ claimed: 1, completed: 0, retried: 0, failed: 1 });
      await expect(c.store.get(BOX, 'r-1')).resolves.toMatchObject({
        status: 'FAILED',
        attempts: 1,
        lastError: 'poison message',
        completedAt: null,
      });

      await expect(
        claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 + 86_400_000 }),
      ).resolves.toEqual(['r-2']);
      const failed = await c.store.listFailed(BOX, 10);
      expect(idsOf(failed)).toEqual(['r-1']);
      expect(failed[0]).toMatchObject({ status: 'FAILED', lastError: 'poison message' });
    });

    it('released: leaves the record exactly as it was, handed out again at once', async () => {
      await appendCommitted(c.store, BOX, [record('r-1')]);
      // A retried record first, so that "as it was" includes attempts and an error.
      await claimWith(c.store, BOX, { limit: 10, now: c.t0 }, (each) => ({
        id: each.id,
        status: 'retry',
        nextAttemptAt: c.t0 + 10,
        error: 'first try',
      }));
      const before = await c.store.get(BOX, 'r-1');

      const { result } = await claimWith(c.store, BOX, { limit: 10, now: c.t0 + 10 }, (each) => ({
        id: each.id,
        status: 'released',
      }));
      expect(result).toEqual({ claimed: 1, completed: 0, retried: 0, failed: 0 });
      await expect(c.store.get(BOX, 'r-1')).resolves.toEqual(before);
      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 + 10 })).resolves.toEqual([
        'r-1',
      ]);
    });

    describe('with deleteCompleted', () => {
      const deleting = { limit: 10, deleteCompleted: true } as const;

      it('deletes completed records in the claim, never handing them out again', async () => {
        await appendCommitted(c.store, BOX, records('r', 3));
        const result = await c.store.claim(BOX, { ...deleting, now: c.t0 }, async (batch) =>
          completeAll(batch),
        );
        expect(result).toEqual({ claimed: 3, completed: 3, retried: 0, failed: 0 });
        for (const id of ids) await expect(c.store.get(BOX, id)).resolves.toBeUndefined();
        await expect(c.store.stats(BOX)).resolves.toEqual({
          pending: 0,
          failed: 0,
          oldestPendingAt: null,
        });
        await expect(
          claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 + 86_400_000 }),
        ).resolves.toEqual([]);
      });

      it('writes retry and failed outcomes, and leaves released records, as without it', async () => {
        await appendCommitted(c.store, BOX, records('r', 4));
        const before = await c.store.get(BOX, 'r-4');
        const result = await c.store.claim(BOX, { ...deleting, now: c.t0 }, async () => [
          { id: 'r-1', status: 'completed' },
          { id: 'r-2', status: 'retry', nextAttemptAt: c.t0 + 1_000, error: 'later' },
          { id: 'r-3', status: 'failed', error: 'never' },
          { id: 'r-4', status: 'released' },
        ]);
        expect(result).toEqual({ claimed: 4, completed: 1, retried: 1, failed: 1 });
        await expect(c.store.get(BOX, 'r-1')).resolves.toBeUndefined();
        await expect(c.store.get(BOX, 'r-2')).resolves.toMatchObject({
          status: 'PENDING',
          attempts: 1,
          lastError: 'later',
        });
        await expect(c.store.get(BOX, 'r-3')).resolves.toMatchObject({
          status: 'FAILED',
          lastError: 'never',
        });
        await expect(c.store.get(BOX, 'r-4')).resolves.toEqual(before);
      });

      it('deletes nothing when handle throws: every record is handed out again', async () => {
        await appendCommitted(c.store, BOX, records('r', 3));
        const before = await getAll(c.store, BOX, ids);
        await expect(
          c.store.claim(BOX, { ...deleting, now: c.t0 }, async (batch) => {
            // Published, then the relay dies before it settles: the claim rolls back.
            completeAll(batch);
            throw new Error('relay crashed after publishing');
          }),
        ).rejects.toThrow('relay crashed after publishing');
        await expect(getAll(c.store, BOX, ids)).resolves.toEqual(before);
        await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 })).resolves.toEqual(
          ids,
        );
      });

      it('lets an ordered claim take the next record of a partition once the earlier one is deleted', async () => {
        await appendCommitted(c.store, BOX, records('p', 3, 'Order:1'));
        const ordered = { ...deleting, limit: 1, ordered: true };
        await expect(claimAndComplete(c.store, BOX, { ...ordered, now: c.t0 })).resolves.toEqual([
          'p-1',
        ]);
        await expect(c.store.get(BOX, 'p-1')).resolves.toBeUndefined();
        await expect(claimAndComplete(c.store, BOX, { ...ordered, now: c.t0 })).resolves.toEqual([
          'p-2',
        ]);
      });

      it('forgets a deleted id: the same id appended again is a new record', async () => {
        await appendCommitted(c.store, BOX, [record('r-1')]);
        await c.store.claim(BOX, { ...deleting, now: c.t0 }, async (batch) => completeAll(batch));
        await appendCommitted(c.store, BOX, [record('r-1')]);
        await expect(c.store.get(BOX, 'r-1')).resolves.toMatchObject({
          status: 'PENDING',
          attempts: 0,
        });
      });
    });

    it('treats a record handle gives no outcome for as released', async () => {
      await appendCommitted(c.store, BOX, records('r', 3));
      const before = await getAll(c.store, BOX, ids);
      const result = await c.store.claim(BOX, { limit: 10, now: c.t0 }, async () => [
        { id: 'r-2', status: 'completed' },
      ]);
      expect(result).toEqual({ claimed: 3, completed: 1, retried: 0, failed: 0 });
      await expect(c.store.get(BOX, 'r-1')).resolves.toEqual(before[0]);
      await expect(c.store.get(BOX, 'r-3')).resolves.toEqual(before[2]);
      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 })).resolves.toEqual([
        'r-1',
        'r-3',
      ]);
    });

    it('counts each outcome in its result', async () => {
      await appendCommitted(c.store, BOX, records('r', 5));
      const outcomes: RecordOutcome[] = [
        { id: 'r-1', status: 'completed' },
        { id: 'r-2', status: 'retry', nextAttemptAt: c.t0 + 1_000, error: 'later' },
        { id: 'r-3', status: 'failed', error: 'never' },
        { id: 'r-4', status: 'released' },
        { id: 'r-5', status: 'completed' },
      ];
      await expect(
        c.store.claim(BOX, { limit: 10, now: c.t0 }, async () => outcomes),
      ).resolves.toEqual({ claimed: 5, completed: 2, retried: 1, failed: 1 });
      await expect(c.store.stats(BOX)).resolves.toMatchObject({ pending: 2, failed: 1 });
    });

    it('rejects with the error handle throws, leaving every record as it was', async () => {
      await appendCommitted(c.store, BOX, records('r', 3));
      const before = await getAll(c.store, BOX, ids);
      const boom = new Error('relay crashed');
      await expect(
        c.store.claim(BOX, { limit: 10, now: c.t0 }, async () => {
          throw boom;
        }),
      ).rejects.toBe(boom);

      await expect(getAll(c.store, BOX, ids)).resolves.toEqual(before);
      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 })).resolves.toEqual(ids);
    });

    it('rejects with ClaimCommitRefusedError when the database refuses the COMMIT (a deferred constraint what handle wrote breaks), leaving every record as it was', async () => {
      const parent = await c.businessTable();
      const child = `${parent.name}_child`;
      // The same statement on PostgreSQL and SQLite: checked at COMMIT, not at the INSERT.
      await c.store.transaction((tx) =>
        tx.query(
          `CREATE TABLE ${child} (id TEXT PRIMARY KEY, parent TEXT NOT NULL ` +
            `REFERENCES ${parent.name} (id) DEFERRABLE INITIALLY DEFERRED)`,
        ),
      );
      try {
        await appendCommitted(c.store, BOX, records('r', 3));
        const before = await getAll(c.store, BOX, ids);
        const refused = c.store.claim(BOX, { limit: 10, now: c.t0 }, async (batch) => {
          const [first, second] = placeholders(batch.transaction.dialect, 2).split(', ');
          await batch.transaction.query(`INSERT INTO ${child} VALUES (${first}, ${second})`, [
            'c-1',
            'missing',
          ]);
          return completeAll(batch);
        });
        await expect(refused).rejects.toBeInstanceOf(ClaimCommitRefusedError);
        await expect(refused).rejects.toMatchObject({
          cause: expect.objectContaining({ message: expect.any(String) }),
        });

        await expect(getAll(c.store, BOX, ids)).resolves.toEqual(before);
        await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 })).resolves.toEqual(
          ids,
        );
      } finally {
        await c.store.transaction((tx) => tx.query(`DROP TABLE IF EXISTS ${child}`));
      }
    });

    it("commits what handle writes through the batch's transaction with the outcomes", async () => {
      const table = await c.businessTable();
      await appendCommitted(c.store, BOX, [record('r-1')]);
      await c.store.claim(BOX, { limit: 10, now: c.t0 }, async (batch) => {
        expect(batch.transaction.dialect).toBe(c.store.dialect);
        await table.insert(batch.transaction, 'handled-r-1', 'done');
        return completeAll(batch);
      });
      await expect(table.read('handled-r-1')).resolves.toBe('done');
      await expect(c.store.get(BOX, 'r-1')).resolves.toMatchObject({ status: 'COMPLETED' });
    });

    it("rolls back what handle wrote through the batch's transaction when it throws", async () => {
      const table = await c.businessTable();
      await appendCommitted(c.store, BOX, [record('r-1')]);
      await expect(
        c.store.claim(BOX, { limit: 10, now: c.t0 }, async (batch) => {
          await table.insert(batch.transaction, 'handled-r-1', 'done');
          throw new Error('handler fails after writing');
        }),
      ).rejects.toThrow('handler fails after writing');
      await expect(table.read('handled-r-1')).resolves.toBeUndefined();
      await expect(c.store.get(BOX, 'r-1')).resolves.toMatchObject({
        status: 'PENDING',
        attempts: 0,
      });
    });

    it("joins a transaction() started inside handle to the claim's: it commits with the outcomes", async () => {
      const table = await c.businessTable();
      await appendCommitted(c.store, 'inbox_commands', [record('cmd-1')]);
      await c.store.claim('inbox_commands', { limit: 10, now: c.t0 }, async (batch) => {
        await c.store.transaction(async (tx) => {
          await table.insert(tx, 'handled-cmd-1', 'done');
          await c.store.append('outbox_events', [record('evt-from-cmd-1')], tx);
        });
        return completeAll(batch);
      });
      await expect(table.read('handled-cmd-1')).resolves.toBe('done');
      await expect(
        claimAndComplete(c.store, 'outbox_events', { limit: 10, now: c.t0 }),
      ).resolves.toEqual(['evt-from-cmd-1']);
    });

    it("joins a transaction() started inside handle to the claim's: it rolls back with a throwing handle", async () => {
      const table = await c.businessTable();
      await appendCommitted(c.store, 'inbox_commands', [record('cmd-1')]);
      await expect(
        c.store.claim('inbox_commands', { limit: 10, now: c.t0 }, async () => {
          await c.store.transaction(async (tx) => {
            await table.insert(tx, 'handled-cmd-1', 'done');
            await c.store.append('outbox_events', [record('evt-from-cmd-1')], tx);
          });
          throw new Error('handler fails after its transaction resolved');
        }),
      ).rejects.toThrow('handler fails after its transaction resolved');
      await expect(table.read('handled-cmd-1')).resolves.toBeUndefined();
      await expect(c.store.get('outbox_events', 'evt-from-cmd-1')).resolves.toBeUndefined();
      await expect(c.store.get('inbox_commands', 'cmd-1')).resolves.toMatchObject({
        status: 'PENDING',
        attempts: 0,
      });
    });

    it('rolls back a claim whose handle returned while a transaction() it started was still open, and both reject', async () => {
      const table = await c.businessTable();
      await appendCommitted(c.store, 'inbox_commands', [record('cmd-1')]);
      let nested: Promise<unknown> | undefined;
      const wrote = deferred();
      const go = deferred();
      // Not awaited: a COMMIT now would keep what it wrote so far, whatever it does next.
      const claim = c.store.claim('inbox_commands', { limit: 10, now: c.t0 }, async (batch) => {
        nested = c.store.transaction(async (tx) => {
          await table.insert(tx, 'half-1', 'undone');
          await c.store.append('outbox_events', [record('evt-half-1')], tx);
          wrote.resolve();
          await go.promise;
          await table.insert(tx, 'half-2', 'undone');
        });
        nested.catch(() => undefined);
        await wrote.promise;
        return completeAll(batch);
      });
      await expect(claim).rejects.toThrow(NestedTransactionOpenError);
      go.resolve();
      await expect(nested).rejects.toThrow();

      for (const id of ['half-1', 'half-2']) {
        await expect(table.read(id)).resolves.toBeUndefined();
      }
      await expect(c.store.get('outbox_events', 'evt-half-1')).resolves.toBeUndefined();
      await expect(c.store.get('inbox_commands', 'cmd-1')).resolves.toMatchObject({
        status: 'PENDING',
        attempts: 0,
      });
    });
  });
}
