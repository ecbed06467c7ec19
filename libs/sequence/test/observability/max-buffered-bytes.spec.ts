import { createSequenceTestApp, metricValue } from '../support/sequence-test-app';

describe('max_buffered_bytes', () => {
  it('reports sequence.maxBufferedBytes, what the buffer alert divides by', async () => {
    const t = await createSequenceTestApp('observability.budget', {
      sequence: { maxBufferedBytes: 64 * 1024 * 1024, maxSequenceBytes: 16 * 1024 * 1024 },
    });
    try {
      expect(await metricValue(t.metrics.registry, 'nest_sequence_max_buffered_bytes')).toBe(
        64 * 1024 * 1024,
      );
    } finally {
      await t.close();
    }
  });
});
