import type { OutboxStore } from '../../../ports/outbox-store.port';
import {
  appendCommitted,
  BOX,
  completeAll,
  deferred,
  getAll,
  idsOf,
  range,
  record,
  records,
  sleep,
  type OutboxSuiteContext,
} from './outbox-suite.context';

/**
 * Several claims, transactions and receives at once, on one instance and across instances. A
 * store may run them side by side (PostgreSQL's row locks) or one after the other (SQLite's single
 * writer): the cases hold either way, asserting what was handed out rather than when.
 */
export function describeConcurrencyCases(c: OutboxSuiteContext): void {
  describe('concurrency', () => {
    /** Claims until a claim comes back empty, completing everything; the ids, in handed order. */
    async function claimUntilEmpty(
      store: OutboxStore,
      options: { limit: number; ordered?: boolean },
      log: string[],
    ): Promise<void> {
      for (let round = 0; round < 1_000; round++) {
        const result = await store.claim(BOX, { ...options, now: c.t0 }, async (batch) => {
          log.push(...idsOf(batch));
          // Let the other claimers run while this batch is held.
          await sleep(1);
          return completeAll(batch);
        });
        if (result.claimed === 0) return;
      }
      throw new Error('a claimer never saw the box empty');
    }

    async function instances(count: number): Promise<OutboxStore[]> {
      const peers = await Promise.all(range(2, count).map(() => c.peer()));
      return [c.store, ...peers];
    }

    it.each([
      ['this instance', (): Promise<OutboxStore> => Promise.resolve(c.store)],
      ['a peer', (): Promise<OutboxStore> => c.peer()],
    ])('never hands a record held by one claim to another on %s', async (_where, other) => {
      const ids = range(1, 6).map((index) => `r-${index}`);
      await appendCommitted(c.store, BOX, records('r', 6));
      const second = await other();
      const entered = deferred();
      const release = deferred();
      const firstIds: string[] = [];
      const secondIds: string[] = [];

      const firstClaim = c.store.claim(BOX, { limit: 3, now: c.t0 }, async (batch) => {
        firstIds.push(...idsOf(batch));
        entered.resolve();
        await release.promise;
        return completeAll(batch);
      });
      await entered.promise;
      const secondClaim = second.claim(BOX, { limit: 10, now: c.t0 }, async (batch) => {
        secondIds.push(...idsOf(batch));
        return completeAll(batch);
      });
      // PostgreSQL hands the second claim the unlocked records at once; SQLite's waits its turn.
      await Promise.race([secondClaim.catch(() => undefined), sleep(200)]);
      const secondWhileHeld = [...secondIds];
      release.resolve();
      await Promise.all([firstClaim, secondClaim]);

      expect(firstIds).toEqual(['r-1', 'r-2', 'r-3']);
      expect(secondWhileHeld.filter((id) => firstIds.includes(id))).toEqual([]);
      expect(secondIds.filter((id) => firstIds.includes(id))).toEqual([]);
      expect([...firstIds, ...secondIds].sort()).toEqual(ids);
      for (const stored of await getAll(c.store, BOX, ids)) {
        expect(stored).toMatchObject({ status: 'COMPLETED', attempts: 1 });
      }
    });

    it('completes every record exactly once with four instances claiming at once', async () => {
      const ids = range(1, 200).map((index) => `r-${index}`);
      await appendCommitted(c.store, BOX, records('r', 200));
      const handed: string[] = [];

      await Promise.all(
        (await instances(4)).map((store) => claimUntilEmpty(store, { limit: 7 }, handed)),
      );

      expect(handed).toHaveLength(ids.length);
      expect([...handed].sort()).toEqual([...ids].sort());
      await expect(c.store.stats(BOX)).resolves.toEqual({
        pending: 0,
        failed: 0,
        oldestPendingAt: null,
      });
      for (const stored of await getAll(c.store, BOX, ids)) expect(stored.attempts).toBe(1);
    });

    it('hands out each partition in append order with four instances claiming ordered at once', async () => {
      const partitions = ['P', 'Q', 'R', 'S', 'T'];
      const items = range(1, 12).flatMap((index) =>
        partitions.map((key) => record(`${key}-${index}`, { partitionKey: key })),
      );
      await appendCommitted(c.store, BOX, items);
      const handed: string[] = [];

      await Promise.all(
        (await instances(4)).map((store) =>
          claimUntilEmpty(store, { limit: 4, ordered: true }, handed),
        ),
      );

      expect(handed).toHaveLength(items.length);
      for (const key of partitions) {
        expect(handed.filter((id) => id.startsWith(`${key}-`))).toEqual(
          range(1, 12).map((index) => `${key}-${index}`),
        );
      }
    });

    it('commits every one of many transactions running at once on two instances', async () => {
      const [store, peer] = await instances(2);
      await Promise.all(
        range(1, 20).map((index) => {
          const on = index % 2 ? store : peer;
          return on.transaction(async (tx) => {
            await on.append(BOX, [record(`t${index}-a`)], tx);
            // Held open across a turn of the event loop, so that the transactions overlap.
            await sleep(1);
            await on.append(BOX, [record(`t${index}-b`)], tx);
          });
        }),
      );
      await expect(c.store.stats(BOX)).resolves.toMatchObject({ pending: 40 });
      const stored = await getAll(
        c.store,
        BOX,
        range(1, 20).flatMap((index) => [`t${index}-a`, `t${index}-b`]),
      );
      expect(new Set(stored.map((each) => each.seq)).size).toBe(40);
    });

    it('answers added to exactly one of several instances receiving one id at once', async () => {
      const all = await instances(2);
      const answers = await Promise.all(
        range(1, 6).map((index) =>
          all[index % all.length].receive('inbox_events', record('msg-1', { body: `"${index}"` })),
        ),
      );
      expect(answers.filter((answer) => answer === 'added')).toHaveLength(1);
      expect(answers.filter((answer) => answer === 'duplicate')).toHaveLength(5);
      await expect(c.store.stats('inbox_events')).resolves.toMatchObject({ pending: 1 });
    });
  });
}
