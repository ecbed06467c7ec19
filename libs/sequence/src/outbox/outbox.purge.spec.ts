import { OutboxPurge } from './outbox.purge';
import { BOX_NAMES, type OutboxStore, type PurgeOptions } from '../ports/outbox-store.port';
import type { ResolvedOptions } from '../options/resolved-options';

/**
 * Sweeper.sweep(now) runs the sweep "with `now` as the time of the run" (tests give a later one;
 * see clockFrom in core/async): the retention cut-off is taken from it, not from Date.now().
 */
describe('OutboxPurge.sweep(now)', () => {
  it('computes completedBefore from the time it is given, as every other sweeper does', async () => {
    const asked: PurgeOptions[] = [];
    const store = {
      purge: async (_box: string, options: PurgeOptions) => {
        asked.push(options);
        return 0;
      },
    } as unknown as OutboxStore;
    const retentionMs = 60_000;
    const options = {
      outbox: {
        boxes: Object.fromEntries(BOX_NAMES.map((box) => [box, { retentionMs }])),
      },
      tuning: { sweepers: { purge: { intervalMs: false, batchSize: 10 } } },
    } as unknown as Pick<ResolvedOptions, 'outbox' | 'tuning'>;
    const purge = new OutboxPurge(store, options, undefined);

    const later = Date.now() + 10 * 86_400_000; // ten days on
    await purge.sweep(later);

    expect(asked).toHaveLength(BOX_NAMES.length);
    // The run's clock starts at `later` and moves on with real time (a few ms here).
    for (const each of asked) {
      expect(each.completedBefore).toBeGreaterThanOrEqual(later - retentionMs);
      expect(each.completedBefore).toBeLessThan(later - retentionMs + 1_000);
    }
  });
});
