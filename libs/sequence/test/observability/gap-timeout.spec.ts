import { createResequencerTestApp } from '../resequencer/resequencer-test-app';
import { metricValue } from '../support/sequence-test-app';

describe('resequencer_gap_timeout_seconds', () => {
  it("reports each resequencer's gap.timeoutMs, what the open-gap alert compares ages with", async () => {
    const t = await createResequencerTestApp({
      channel: 'observability.gap-timeout',
      gap: { timeoutMs: 45_000, policy: 'alert' },
    });
    try {
      expect(
        await metricValue(t.metrics.registry, 'nest_sequence_resequencer_gap_timeout_seconds', {
          resequencer: 'observability.gap-timeout',
        }),
      ).toBe(45);
    } finally {
      await t.close();
    }
  });
});
