import { acceptAll, type ResequencerSuiteContext } from './resequencer-suite.context';

/** `gapStats`: the count of open gaps and the oldest one's age, as gauges read them. */
export function describeGapStatsCases(c: ResequencerSuiteContext): void {
  describe('gap stats', () => {
    it('reports no open gap, and no age, for a scope without gaps', async () => {
      await expect(c.store.gapStats(c.scope, c.t0)).resolves.toEqual({ openGaps: 0 });
      await acceptAll(c.store, c.key(), [1, 2], c.t0);
      await expect(c.store.gapStats(c.scope, c.t0 + 10)).resolves.toEqual({ openGaps: 0 });
    });

    it('counts every key waiting on a gap and ages the oldest at now', async () => {
      await acceptAll(c.store, c.key('k-late'), [3], c.t0 + 30);
      await acceptAll(c.store, c.key('k-early'), [2, 5], c.t0 + 10);
      await acceptAll(c.store, c.key('k-none'), [1], c.t0);
      await expect(c.store.gapStats(c.scope, c.t0 + 1_000)).resolves.toEqual({
        openGaps: 2,
        oldestGapAgeMs: 990,
      });
    });

    it('counts alerted gaps, which still wait, and ages them from when they opened', async () => {
      await acceptAll(c.store, c.key('k-alerted'), [2], c.t0);
      await acceptAll(c.store, c.key('k-due'), [2], c.t0 + 50);
      await c.store.resolveGap(c.key('k-alerted'), 'alert', { openedBefore: c.t0, now: c.t0 + 60 });
      await expect(c.store.gapStats(c.scope, c.t0 + 100)).resolves.toEqual({
        openGaps: 2,
        oldestGapAgeMs: 100,
      });
      await c.store.resolveGap(c.key('k-due'), 'alert', {
        openedBefore: c.t0 + 50,
        now: c.t0 + 110,
      });
      await expect(c.store.gapStats(c.scope, c.t0 + 200)).resolves.toEqual({
        openGaps: 2,
        oldestGapAgeMs: 200,
      });
    });

    it('stops counting a gap once it fills or is skipped', async () => {
      await acceptAll(c.store, c.key('k-fills'), [2], c.t0);
      await acceptAll(c.store, c.key('k-skipped'), [3], c.t0 + 20);
      await acceptAll(c.store, c.key('k-fills'), [1], c.t0 + 40);
      await expect(c.store.gapStats(c.scope, c.t0 + 100)).resolves.toEqual({
        openGaps: 1,
        oldestGapAgeMs: 80,
      });
      await c.store.resolveGap(c.key('k-skipped'), 'skip', {
        openedBefore: c.t0 + 20,
        now: c.t0 + 100,
      });
      await expect(c.store.gapStats(c.scope, c.t0 + 200)).resolves.toEqual({ openGaps: 0 });
    });

    it('keeps scopes apart, and never reports a negative age', async () => {
      await acceptAll(c.store, { scope: `${c.scope}.other`, key: 'k' }, [2], c.t0);
      await acceptAll(c.store, c.key(), [2], c.t0 + 500);
      await expect(c.store.gapStats(c.scope, c.t0 + 1_000)).resolves.toEqual({
        openGaps: 1,
        oldestGapAgeMs: 500,
      });
      // A caller whose clock is a little behind the instance that opened the gap.
      await expect(c.store.gapStats(c.scope, c.t0 + 400)).resolves.toEqual({
        openGaps: 1,
        oldestGapAgeMs: 0,
      });
    });

    it('is shared by every instance over the same state', async () => {
      const peer = await c.peer();
      await acceptAll(c.store, c.key(), [2], c.t0);
      await expect(peer.gapStats(c.scope, c.t0 + 100)).resolves.toEqual({
        openGaps: 1,
        oldestGapAgeMs: 100,
      });
    });
  });
}
