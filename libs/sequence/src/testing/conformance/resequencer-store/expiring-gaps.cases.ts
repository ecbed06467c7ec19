import {
  acceptAll,
  drainAll,
  eventSeqs,
  type ResequencerSuiteContext,
} from './resequencer-suite.context';

/**
 * `listExpiringGaps` and `resolveGap`'s `unchangedSince`: the keys that retention would soon
 * delete with the events held behind their gap, and dead-lettering them only if they did not
 * change since they were listed.
 */
export function describeExpiringGapCases(c: ResequencerSuiteContext): void {
  describe('gaps close to retention', () => {
    /** Nine tenths of the retention: how long a key must not change to be listed. */
    const idle = (): number => c.retentionMs - Math.floor(c.retentionMs / 10);

    it('lists a key holding events behind a gap, alerted or not, once it has been idle for nine tenths of the retention', async () => {
      await acceptAll(c.store, c.key('k-alerted'), [3], c.t0);
      await c.store.resolveGap(c.key('k-alerted'), 'alert', { openedBefore: c.t0, now: c.t0 + 10 });
      await drainAll(c.store, c.key('k-alerted'), c.t0 + 10);
      await acceptAll(c.store, c.key('k-waiting'), [2, 4], c.t0 + 20);
      await acceptAll(c.store, c.key('k-no-gap'), [1], c.t0);
      await acceptAll(c.store, c.key('k-filled'), [2, 1], c.t0);

      await expect(c.store.listExpiringGaps(c.scope, c.t0 + 9 + idle(), 10)).resolves.toEqual([]);
      await expect(c.store.listExpiringGaps(c.scope, c.t0 + 20 + idle(), 10)).resolves.toEqual([
        {
          key: 'k-alerted',
          expected: 1,
          buffered: 1,
          lowest: 3,
          gapSince: c.t0,
          alerted: true,
          changedAt: c.t0 + 10,
        },
        {
          key: 'k-waiting',
          expected: 1,
          buffered: 2,
          lowest: 2,
          gapSince: c.t0 + 20,
          alerted: false,
          changedAt: c.t0 + 20,
        },
      ]);
      // Past its retention a key is gone: not listed any more.
      const gaps = await c.store.listExpiringGaps(c.scope, c.t0 + 10 + c.retentionMs, 10);
      expect(gaps.map((gap) => gap.key)).toEqual(['k-waiting']);
    });

    it('lists the least recently changed first, at most limit, and keeps scopes apart', async () => {
      await acceptAll(c.store, c.key('k-b'), [5], c.t0 + 2);
      await acceptAll(c.store, c.key('k-a'), [5], c.t0 + 1);
      await acceptAll(c.store, c.key('k-c'), [5], c.t0 + 3);
      await acceptAll(c.store, { scope: `${c.scope}.other`, key: 'k-0' }, [5], c.t0);

      const gaps = await c.store.listExpiringGaps(c.scope, c.t0 + 3 + idle(), 2);
      expect(gaps.map((gap) => gap.key)).toEqual(['k-a', 'k-b']);
    });

    it('dead-letters a listed key only if it has not changed since', async () => {
      const key = c.key('k-moving');
      await acceptAll(c.store, key, [3], c.t0);
      const [listed] = await c.store.listExpiringGaps(c.scope, c.t0 + idle(), 10);
      expect(listed).toMatchObject({ key: 'k-moving', changedAt: c.t0 });
      // Another event arrives after the listing: the key is alive, its events are not at risk.
      await acceptAll(c.store, key, [4], c.t0 + idle());

      await expect(
        c.store.resolveGap(key, 'dead-letter', {
          openedBefore: listed.gapSince,
          now: c.t0 + idle() + 1,
          unchangedSince: listed.changedAt,
        }),
      ).resolves.toEqual({ kind: 'none' });
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ next: 1, buffered: [3, 4] });

      await expect(
        c.store.resolveGap(key, 'dead-letter', {
          openedBefore: listed.gapSince,
          now: c.t0 + idle() + 2,
          unchangedSince: c.t0 + idle(),
        }),
      ).resolves.toEqual({ kind: 'resolved', policy: 'dead-letter', appended: 2 });
      const items = await drainAll(c.store, key, c.t0 + idle() + 3);
      expect(items.map((item) => item.kind)).toEqual(['dead-letter', 'dead-letter']);
      expect(items.map((item) => (item.kind === 'dead-letter' ? item.entry.seq : 0))).toEqual([
        3, 4,
      ]);
      expect(eventSeqs(items)).toEqual([]);
      await expect(c.store.listExpiringGaps(c.scope, c.t0 + 2 * idle(), 10)).resolves.toEqual([]);
    });
  });
}
