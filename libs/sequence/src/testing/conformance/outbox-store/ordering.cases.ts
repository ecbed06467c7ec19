import type { OutboxStore } from '../../../ports/outbox-store.port';
import {
  appendCommitted,
  BOX,
  claimAndComplete,
  claimWith,
  completeAll,
  deferred,
  getAll,
  idsOf,
  record,
  records,
  sleep,
  type OutboxSuiteContext,
} from './outbox-suite.context';

/** `seq` order, `limit`, and ordered claims: a partition's head holds back the rest of it. */
export function describeOrderingCases(c: OutboxSuiteContext): void {
  describe('order', () => {
    it('numbers records in append order with strictly increasing seq, never reusing one', async () => {
      await appendCommitted(c.store, BOX, [record('z'), record('a')]);
      await appendCommitted(c.store, BOX, [record('m')]);
      const [z, a, m] = await getAll(c.store, BOX, ['z', 'a', 'm']);
      for (const each of [z, a, m]) expect(Number.isSafeInteger(each.seq)).toBe(true);
      expect(z.seq).toBeLessThan(a.seq);
      expect(a.seq).toBeLessThan(m.seq);

      // The highest seq purged: a store that reused it would hand it to the next record.
      await claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 });
      await expect(c.store.purge(BOX, { completedBefore: c.t0 + 1, batchSize: 100 })).resolves.toBe(
        3,
      );
      await appendCommitted(c.store, BOX, [record('after-purge')]);
      const [afterPurge] = await getAll(c.store, BOX, ['after-purge']);
      expect(afterPurge.seq).toBeGreaterThan(m.seq);
    });

    it('hands out records in seq order, not id order, across transactions', async () => {
      await appendCommitted(c.store, BOX, [record('c'), record('a')]);
      await appendCommitted(c.store, BOX, [record('b')]);
      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 })).resolves.toEqual([
        'c',
        'a',
        'b',
      ]);
    });

    it('hands out at most limit records per claim, the rest to later claims', async () => {
      await appendCommitted(c.store, BOX, records('r', 5));
      const at = { limit: 2, now: c.t0 };
      await expect(claimAndComplete(c.store, BOX, at)).resolves.toEqual(['r-1', 'r-2']);
      await expect(claimAndComplete(c.store, BOX, at)).resolves.toEqual(['r-3', 'r-4']);
      await expect(claimAndComplete(c.store, BOX, at)).resolves.toEqual(['r-5']);
      await expect(claimAndComplete(c.store, BOX, at)).resolves.toEqual([]);
    });
  });

  describe('ordered claims', () => {
    const later = (): number => c.t0 + 3_600_000;

    /** A1, A2 (partition A), B1 (partition B), N1 (no partition), in this append order. */
    async function appendPartitions(): Promise<void> {
      await appendCommitted(c.store, BOX, [
        record('A1', { partitionKey: 'A' }),
        record('A2', { partitionKey: 'A' }),
        record('B1', { partitionKey: 'B' }),
        record('N1', { partitionKey: null }),
      ]);
    }

    /** Claims A1 alone and gives it `status`. */
    async function settleA1(status: 'retry' | 'failed' | 'released'): Promise<void> {
      const { handed } = await claimWith(c.store, BOX, { limit: 1, now: c.t0 }, (each) =>
        status === 'retry'
          ? { id: each.id, status, nextAttemptAt: later(), error: 'not now' }
          : status === 'failed'
            ? { id: each.id, status, error: 'poison' }
            : { id: each.id, status },
      );
      expect(handed).toEqual(['A1']);
    }

    const ordered = (now = c.t0, limit = 10) => ({ limit, now, ordered: true });

    it('holds back the rest of a partition behind a pending head not yet due, and only that partition', async () => {
      await appendPartitions();
      await settleA1('retry');
      await expect(claimAndComplete(c.store, BOX, ordered())).resolves.toEqual(['B1', 'N1']);
      await expect(claimAndComplete(c.store, BOX, ordered())).resolves.toEqual([]);
      await expect(claimAndComplete(c.store, BOX, ordered(later()))).resolves.toEqual(['A1', 'A2']);
    });

    it('hands out a head whose retry time is past options.horizon, and its partition after it', async () => {
      await appendPartitions();
      await settleA1('retry');
      const past = { ...ordered(), horizon: later() - 1 };
      const handed = await claimAndComplete(c.store, BOX, past);
      expect(handed.filter((id) => id !== 'A2')).toEqual(['A1', 'B1', 'N1']);
      if (!handed.includes('A2')) {
        await expect(claimAndComplete(c.store, BOX, past)).resolves.toEqual(['A2']);
      }
    });

    it('holds back the rest of a partition behind a FAILED head until it is retried', async () => {
      await appendPartitions();
      await settleA1('failed');
      await expect(claimAndComplete(c.store, BOX, ordered())).resolves.toEqual(['B1', 'N1']);
      await expect(claimAndComplete(c.store, BOX, ordered(later()))).resolves.toEqual([]);

      await expect(c.store.retry(BOX, ['A1'], c.t0 + 1)).resolves.toBe(1);
      await expect(claimAndComplete(c.store, BOX, ordered(c.t0 + 1))).resolves.toEqual([
        'A1',
        'A2',
      ]);
    });

    it('hands a released head out again, first of its partition', async () => {
      await appendPartitions();
      await settleA1('released');
      const handed = await claimAndComplete(c.store, BOX, ordered());
      expect(handed.filter((id) => id.startsWith('A'))[0]).toBe('A1');
      expect(handed).toEqual(expect.arrayContaining(['A1', 'B1', 'N1']));
    });

    it('hands out the next record of a partition once its head is COMPLETED', async () => {
      await appendPartitions();
      await expect(claimAndComplete(c.store, BOX, ordered(c.t0, 1))).resolves.toEqual(['A1']);
      await expect(claimAndComplete(c.store, BOX, ordered(c.t0, 1))).resolves.toEqual(['A2']);
    });

    it('may hand out a partition head and what follows it in one batch, head first', async () => {
      await appendPartitions();
      const handed = await claimAndComplete(c.store, BOX, ordered());
      expect(handed).toEqual(expect.arrayContaining(['A1', 'B1', 'N1']));
      expect(handed.filter((id) => id !== 'A2')).toEqual(['A1', 'B1', 'N1']);
      if (handed.includes('A2')) expect(handed.indexOf('A2')).toBe(handed.indexOf('A1') + 1);
      await claimAndComplete(c.store, BOX, ordered());
      await expect(c.store.stats(BOX)).resolves.toMatchObject({ pending: 0 });
    });

    it('respects limit', async () => {
      await appendCommitted(c.store, BOX, records('A', 4, 'A'));
      const handed = await claimAndComplete(c.store, BOX, ordered(c.t0, 2));
      expect(handed.length).toBeGreaterThan(0);
      expect(handed.length).toBeLessThanOrEqual(2);
      expect(handed).toEqual(['A-1', 'A-2'].slice(0, handed.length));
    });

    it('never holds back records without a partition key', async () => {
      await appendCommitted(c.store, BOX, records('N', 2, null));
      await claimWith(c.store, BOX, ordered(c.t0, 1), (each) => ({
        id: each.id,
        status: 'retry',
        nextAttemptAt: later(),
        error: 'not now',
      }));
      await expect(claimAndComplete(c.store, BOX, ordered())).resolves.toEqual(['N-2']);
    });

    it('does not apply to unordered claims, which ignore partitions', async () => {
      await appendPartitions();
      await settleA1('failed');
      await expect(claimAndComplete(c.store, BOX, { limit: 10, now: c.t0 })).resolves.toEqual([
        'A2',
        'B1',
        'N1',
      ]);
    });

    it.each([
      ['this instance', (): Promise<OutboxStore> => Promise.resolve(c.store)],
      ['a peer', (): Promise<OutboxStore> => c.peer()],
    ])('never hands out A2 while another claim on %s holds A1 unsettled', async (_where, other) => {
      await appendPartitions();
      const second = await other();
      const entered = deferred();
      const release = deferred();
      let firstSettled = false;
      const secondBatches: { ids: string[]; firstSettled: boolean }[] = [];

      const firstClaim = c.store.claim(BOX, ordered(c.t0, 1), async (batch) => {
        entered.resolve();
        await release.promise;
        firstSettled = true;
        return completeAll(batch);
      });
      await entered.promise;
      const secondClaim = second.claim(BOX, ordered(), async (batch) => {
        secondBatches.push({ ids: idsOf(batch), firstSettled });
        return completeAll(batch);
      });
      // PostgreSQL hands the second claim what is unlocked at once; SQLite's waits its turn.
      await Promise.race([secondClaim.catch(() => undefined), sleep(200)]);
      release.resolve();
      await Promise.all([firstClaim, secondClaim]);

      for (const batch of secondBatches) {
        expect(batch.ids).not.toContain('A1');
        if (batch.ids.includes('A2')) expect(batch.firstSettled).toBe(true);
      }
      await claimAndComplete(c.store, BOX, ordered());
      const stored = await getAll(c.store, BOX, ['A1', 'A2', 'B1', 'N1']);
      expect(stored.map((each) => [each.id, each.status, each.attempts])).toEqual([
        ['A1', 'COMPLETED', 1],
        ['A2', 'COMPLETED', 1],
        ['B1', 'COMPLETED', 1],
        ['N1', 'COMPLETED', 1],
      ]);
    });
  });
}
