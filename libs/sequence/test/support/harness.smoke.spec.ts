import {
  bytes,
  createSequenceTestApp,
  eventually,
  makeFragments,
  publishAll,
} from './sequence-test-app';

describe('test harness', () => {
  it('delivers a hand-made sequence to the recording handler', async () => {
    const t = await createSequenceTestApp('harness.smoke');
    try {
      const payload = bytes(10_000);
      await publishAll(
        t.transport,
        'harness.smoke',
        makeFragments('s-1', payload, 1_000).reverse(),
      );
      await eventually(() => t.handler.deliveries.length === 1, 'one delivery');
      expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
      expect(t.handler.deliveries[0].payload.fragments).toBe(10);
    } finally {
      await t.close();
    }
  });
});
