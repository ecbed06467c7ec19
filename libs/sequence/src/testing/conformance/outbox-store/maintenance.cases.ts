import type { RecordOutcome } from '../../../ports/outbox-store.port';
import {
  appendCommitted,
  BOX,
  claimAndComplete,
  getAll,
  idsOf,
  record,
  records,
  sleep,
  type OutboxSuiteContext,
} from './outbox-suite.context';

/** What operators and the housekeeping job use: `get`, `listFailed`, `retry`, `purge`, `stats`. */
export function describeMaintenanceCases(c: OutboxSuiteContext): void {
  /** One claim of everything due, settling each record as `outcomes` says (released when absent). */
  async function settle(
    outcomes: Record<string, 'completed' | 'failed' | 'retry'>,
    now = c.t0,
  ): Promise<void> {
    await c.store.claim(BOX, { limit: 100, now }, async (batch) =>
      batch.records.flatMap((each): RecordOutcome[] => {
        const status = outcomes[each.id];
        if (status === 'failed') return [{ id: each.id, status, error: `${each.id} is poison` }];
        if (status === 'retry') {
          return [{ id: each.id, status, nextAttemptAt: now + 60_000, error: 'later' }];
        }
        return status ? [{ id: each.id, status }] : [];
      }),
    );
  }

  describe('get', () => {
    it('returns the record with this id', async () => {
      await appendCommitted(c.store, BOX, [record('a'), record('b')]);
      await expect(c.store.get(BOX, 'b')).resolves.toEqual(
        expect.objectContaining({ ...record('b'), status: 'PENDING' }),
      );
    });

    it('returns undefined for an id the box does not hold', async () => {
      await appendCommitted(c.store, BOX, [record('a')]);
      await expect(c.store.get(BOX, 'absent')).resolves.toBeUndefined();
    });
  });

  describe('listFailed', () => {
    it('lists FAILED records only, oldest first, at most limit', async () => {
      await appendCommitted(c.store, BOX, records('r', 5));
      await settle({ 'r-1': 'completed', 'r-2': 'failed', 'r-3': 'retry', 'r-4': 'failed' });
      await settle({ 'r-5': 'failed' });

      expect(idsOf(await c.store.listFailed(BOX, 10))).toEqual(['r-2', 'r-4', 'r-5']);
      expect(idsOf(await c.store.listFailed(BOX, 2))).toEqual(['r-2', 'r-4']);
      const [first] = await c.store.listFailed(BOX, 1);
      expect(first).toMatchObject({ status: 'FAILED', lastError: 'r-2 is poison', attempts: 1 });
    });

    it('lists nothing when no record failed', async () => {
      await appendCommitted(c.store, BOX, records('r', 2));
      await expect(c.store.listFailed(BOX, 10)).resolves.toEqual([]);
    });
  });

  describe('discard', () => {
    it('marks FAILED records among the ids DISCARDED, leaving the others as they were', async () => {
      const discard = c.store.discard?.bind(c.store);
      if (!discard) throw new Error(`${c.store.name} does not implement discard`);
      await appendCommitted(c.store, BOX, records('r', 4));
      await settle({ 'r-1': 'failed', 'r-2': 'completed', 'r-3': 'retry', 'r-4': 'failed' });
      const before = await getAll(c.store, BOX, ['r-2', 'r-3', 'r-4']);

      await expect(discard(BOX, ['r-1', 'r-2', 'r-3', 'absent'])).resolves.toBe(1);
      // Not COMPLETED: it was given up on, not published or handled. Its failure is kept.
      const discarded = await c.store.get(BOX, 'r-1');
      expect(discarded).toMatchObject({
        status: 'DISCARDED',
        attempts: 1,
        lastError: 'r-1 is poison',
        completedAt: expect.any(Number),
      });
      await expect(getAll(c.store, BOX, ['r-2', 'r-3', 'r-4'])).resolves.toEqual(before);
      expect(idsOf(await c.store.listFailed(BOX, 10))).toEqual(['r-4']);
    });

    it('reports an inbox record discarded after it FAILED as DISCARDED; a copy received again is a duplicate', async () => {
      const discard = c.store.discard?.bind(c.store);
      if (!discard) throw new Error(`${c.store.name} does not implement discard`);
      const INBOX = 'inbox_events';
      await c.store.receive(INBOX, record('msg-1'));
      await c.store.claim(INBOX, { limit: 10, now: c.t0 }, async () => [
        { id: 'msg-1', status: 'failed', error: 'handler threw' },
      ]);

      await expect(discard(INBOX, ['msg-1'])).resolves.toBe(1);
      await expect(c.store.get(INBOX, 'msg-1')).resolves.toMatchObject({
        status: 'DISCARDED',
        lastError: 'handler threw',
      });
      await expect(c.store.receive(INBOX, record('msg-1'))).resolves.toBe('duplicate');
      await expect(c.store.retry(INBOX, ['msg-1'], c.t0)).resolves.toBe(0);
      await expect(c.store.stats(INBOX)).resolves.toMatchObject({ pending: 0, failed: 0 });
    });

    it('purges a DISCARDED record with the completed ones, after the retention', async () => {
      const discard = c.store.discard?.bind(c.store);
      if (!discard) throw new Error(`${c.store.name} does not implement discard`);
      await appendCommitted(c.store, BOX, records('r', 1));
      await settle({ 'r-1': 'failed' });
      await discard(BOX, ['r-1']);
      const { completedAt } = (await c.store.get(BOX, 'r-1'))!;

      await expect(
        c.store.purge(BOX, { completedBefore: completedAt! + 1, batchSize: 10 }),
      ).resolves.toBe(1);
      await expect(c.store.get(BOX, 'r-1')).resolves.toBeUndefined();
    });

    it('changes nothing the second time, nor for an empty list', async () => {
      const discard = c.store.discard?.bind(c.store);
      if (!discard) throw new Error(`${c.store.name} does not implement discard`);
      await appendCommitted(c.store, BOX, records('r', 1));
      await settle({ 'r-1': 'failed' });
      await expect(discard(BOX, ['r-1'])).resolves.toBe(1);
      await expect(discard(BOX, ['r-1'])).resolves.toBe(0);
      await expect(discard(BOX, [])).resolves.toBe(0);
      await expect(c.store.stats(BOX)).resolves.toMatchObject({ pending: 0, failed: 0 });
    });
  });

  describe('retry', () => {
    it('puts FAILED records back to PENDING with 0 attempts, due at the now it is given', async () => {
      await appendCommitted(c.store, BOX, records('r', 2));
      await settle({ 'r-1': 'failed', 'r-2': 'failed' });
      const now = c.t0 + 5_000;

      await expect(c.store.retry(BOX, ['r-1', 'r-2'], now)).resolves.toBe(2);
      for (const stored of await getAll(c.store, BOX, ['r-1', 'r-2'])) {
        expect(stored).toMatchObject({ status: 'PENDING', attempts: 0 });
        expect(stored.nextAttemptAt).toBeLessThanOrEqual(now);
      }
      await expect(c.store.listFailed(BOX, 10)).resolves.toEqual([]);
      await expect(claimAndComplete(c.store, BOX, { limit: 10, now })).resolves.toEqual([
        'r-1',
        'r-2',
      ]);
    });

    it('counts only the FAILED records among the ids, leaving the others as they were', async () => {
      await appendCommitted(c.store, BOX, records('r', 4));
      await settle({ 'r-1': 'failed', 'r-2': 'completed', 'r-3': 'retry', 'r-4': 'failed' });
      const before = await getAll(c.store, BOX, ['r-2', 'r-3', 'r-4']);

      await expect(c.store.retry(BOX, ['r-1', 'r-2', 'r-3', 'absent'], c.t0 + 1)).resolves.toBe(1);
      await expect(getAll(c.store, BOX, ['r-2', 'r-3', 'r-4'])).resolves.toEqual(before);
      await expect(c.store.get(BOX, 'r-1')).resolves.toMatchObject({ status: 'PENDING' });
    });

    it('retries nothing for an empty list', async () => {
      await appendCommitted(c.store, BOX, records('r', 1));
      await settle({ 'r-1': 'failed' });
      await expect(c.store.retry(BOX, [], c.t0)).resolves.toBe(0);
      await expect(c.store.get(BOX, 'r-1')).resolves.toMatchObject({ status: 'FAILED' });
    });
  });

  describe('purge', () => {
    /** r-1..r-count, all COMPLETED at `completedAt`. */
    async function completedAt(count: number, completedAt: number): Promise<string[]> {
      const items = records('r', count);
      await appendCommitted(c.store, BOX, items);
      await claimAndComplete(c.store, BOX, { limit: 100, now: completedAt });
      return items.map((each) => each.id);
    }

    async function remaining(ids: readonly string[]): Promise<string[]> {
      const found = await Promise.all(ids.map((id) => c.store.get(BOX, id)));
      return ids.filter((_, index) => found[index] !== undefined);
    }

    it('deletes COMPLETED records completed before the time, returning how many', async () => {
      const ids = await completedAt(5, c.t0);
      await expect(c.store.purge(BOX, { completedBefore: c.t0 + 1, batchSize: 2 })).resolves.toBe(
        5,
      );
      await expect(remaining(ids)).resolves.toEqual([]);
    });

    it('keeps records completed at or after the time', async () => {
      const ids = await completedAt(2, c.t0);
      await expect(c.store.purge(BOX, { completedBefore: c.t0, batchSize: 10 })).resolves.toBe(0);
      await expect(remaining(ids)).resolves.toEqual(ids);
    });

    it('stops after maxBatches statements of batchSize records', async () => {
      const ids = await completedAt(5, c.t0);
      await expect(
        c.store.purge(BOX, { completedBefore: c.t0 + 1, batchSize: 2, maxBatches: 1 }),
      ).resolves.toBe(2);
      await expect(remaining(ids)).resolves.toHaveLength(3);
      await expect(
        c.store.purge(BOX, { completedBefore: c.t0 + 1, batchSize: 2, maxBatches: 2 }),
      ).resolves.toBe(3);
    });

    it('never purges PENDING or FAILED records, however old', async () => {
      await appendCommitted(c.store, BOX, records('r', 3));
      await settle({ 'r-1': 'failed', 'r-2': 'retry' });
      const farFuture = c.t0 + 365 * 86_400_000;
      await expect(c.store.purge(BOX, { completedBefore: farFuture, batchSize: 10 })).resolves.toBe(
        0,
      );
      await expect(remaining(['r-1', 'r-2', 'r-3'])).resolves.toEqual(['r-1', 'r-2', 'r-3']);
    });
  });

  describe('stats', () => {
    it('counts nothing in an empty box', async () => {
      await expect(c.store.stats(BOX)).resolves.toEqual({
        pending: 0,
        failed: 0,
        oldestPendingAt: null,
      });
    });

    it('counts PENDING (due or not) and FAILED records, with the createdAt of the oldest PENDING', async () => {
      await appendCommitted(c.store, BOX, [record('r-1')]);
      // Apart in time, so that the oldest is told from the next one.
      await sleep(20);
      await appendCommitted(c.store, BOX, [record('r-2'), record('r-3'), record('r-4')]);
      await appendCommitted(c.store, BOX, [record('r-5')]);
      const [, second] = await getAll(c.store, BOX, ['r-1', 'r-2']);

      await settle({ 'r-1': 'completed', 'r-3': 'retry', 'r-4': 'failed' });
      await expect(c.store.stats(BOX)).resolves.toEqual({
        pending: 3,
        failed: 1,
        oldestPendingAt: second.createdAt,
      });
    });

    it('counts each box on its own', async () => {
      await appendCommitted(c.store, 'outbox_commands', records('r', 2));
      await expect(c.store.stats('outbox_commands')).resolves.toMatchObject({ pending: 2 });
      await expect(c.store.stats('outbox_events')).resolves.toMatchObject({ pending: 0 });
    });
  });
}
