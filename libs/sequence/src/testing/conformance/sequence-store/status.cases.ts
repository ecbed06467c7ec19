import type { SequenceStore } from '../../../ports/sequence-store.port';
import type { OpenSequenceCaseContext } from './open-sequences.cases';

/** `status`, for the stores that offer it (broker-held reassembly's completion markers). */
export function describeStatusCases(c: OpenSequenceCaseContext): void {
  describe('status', () => {
    function statusOf(store: SequenceStore) {
      if (!store.status) throw new Error(`${store.name} lacks status`);
      return store.status.bind(store);
    }

    it('knows nothing of a sequence it never saw', async () => {
      const status = statusOf(c.store());
      const { ref } = c.fixture(c.scope(), ['aa']);
      expect(await status(ref, c.t0())).toEqual({ state: 'unknown' });
    });

    it('reports a sequence with stored fragments as open', async () => {
      const status = statusOf(c.store());
      const { ref, fragments } = c.fixture(c.scope(), ['aa', 'bb']);
      await c.accept(fragments[1], c.t0());
      expect(await status(ref, c.t0() + 1)).toEqual({ state: 'open' });
    });

    it('reports the outcome of a finished sequence until its marker lapses', async () => {
      const store = c.store();
      const status = statusOf(store);
      const { ref, fragments } = c.fixture(c.scope(), ['aa']);
      await c.accept(fragments[0], c.t0());
      expect(await c.finish(ref, c.t0() + 1)).toBe(true);
      expect(await status(ref, c.t0() + 2)).toEqual({ state: 'finished', outcome: 'completed' });
      // finish() gives every marker an hour of retention in this suite.
      expect(await status(ref, c.t0() + 3_600_002)).toEqual({ state: 'unknown' });
    });

    it('records the outcome of a sequence it never held, with its reason', async () => {
      const store = c.store();
      const status = statusOf(store);
      const { ref } = c.fixture(c.scope(), ['aa']);
      const context = { now: c.t0(), retentionMs: 60_000, consumerId: 'elsewhere' };
      const reason = 'handler-failed: boom';
      expect(await store.finish(ref, 'failed', { ...context, reason })).toBe(true);
      expect(await status(ref, c.t0() + 1)).toEqual({
        state: 'finished',
        outcome: 'failed',
        reason,
      });
      // The outcome stands: a second finish changes nothing.
      expect(await store.finish(ref, 'completed', context)).toBe(false);
      expect((await status(ref, c.t0() + 2)).state).toBe('finished');
    });
  });
}
