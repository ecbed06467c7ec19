import type { SequenceStore } from '../ports/sequence-store.port';
import type { SequenceBudgets } from '../kernel/tokens';
import { resolveAdminOptions } from './admin.options';
import type { BoxesReader } from './boxes.reader';
import type { DeadLettersReader } from './dead-letters.reader';
import { OverviewReader } from './overview.reader';
import { ResequencerReader } from './resequencer.reader';
import type { ResequencerCatalog } from '../resequencer/resequencer.catalog';

/** A resequencer whose store counts `open` gaps, of which `openGaps(limit)` lists `limit`. */
function resequencer(name: string, open: number, oldestGapAgeMs: number): unknown {
  return {
    name,
    definition: { gap: { timeoutMs: 3_600_000, policy: 'alert' } },
    gapStats: async () => ({ openGaps: open, oldestGapAgeMs }),
    openGaps: async (limit: number) =>
      Array.from({ length: Math.min(open, limit) }, (_, i) => ({
        key: `key-${i}`,
        expected: 1,
        buffered: 1,
        lowest: 2,
        gapSince: Date.now() - 1000,
        alerted: false,
      })),
  };
}

describe('OverviewReader', () => {
  it('counts every open gap, past the 1000 it looks at for problems', async () => {
    const catalog = {
      all: () => [
        { resequencer: resequencer('status', 2500, 90_000) },
        { resequencer: resequencer('prices', 3, 5_000) },
      ],
    } as unknown as ResequencerCatalog;
    const store = {
      stats: async () => ({ openSequences: 0, bufferedBytes: 0 }),
    } as unknown as SequenceStore;
    const boxes = {
      totals: async () => ({ pending: 0, failed: 0, lagMs: 0 }),
    } as unknown as BoxesReader;
    const reader = new OverviewReader(
      resolveAdminOptions({}),
      store,
      { maxBufferedBytes: 0 } as SequenceBudgets,
      { box: undefined } as unknown as DeadLettersReader,
      new ResequencerReader(catalog),
      boxes,
    );
    const overview = await reader.overview();
    expect(overview.resequencer).toEqual({ openGaps: 2503, oldestGapAgeMs: 90_000 });
  });
});
