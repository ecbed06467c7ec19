import { CLOSED_KEY_NEXT } from '../../../ports/resequencer-store.port';
import {
  acceptAll,
  acceptAt,
  drainAll,
  drainAt,
  event,
  type ResequencerSuiteContext,
} from './resequencer-suite.context';

/**
 * `retire`: a key that holds nothing and has ended is kept `retainMs` (dropping repeats of its
 * events meanwhile), not the store's retention; a key holding anything is not retired, and a
 * change after a retirement gives the key the store's retention again.
 */
export function describeRetireCases(c: ResequencerSuiteContext): void {
  describe('retire', () => {
    const RETAIN_MS = 10_000;

    it("keeps a retired key's next until retainMs has passed, then lets it go", async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1, 2, 3], c.t0);
      await drainAll(c.store, key, c.t0);

      await expect(c.store.retire(key, RETAIN_MS, c.t0 + 10)).resolves.toBe(true);
      // Repeats, until then: late, and no change (they do not keep the key).
      await expect(c.store.accept(key, event(2), acceptAt(c.t0 + 5_000))).resolves.toEqual({
        kind: 'late',
        next: 4,
        pending: false,
      });
      await expect(
        c.store.accept(key, event(1), acceptAt(c.t0 + 10 + RETAIN_MS - 1)),
      ).resolves.toEqual({ kind: 'late', next: 4, pending: false });
      // Then the key has no state: its first event is released as a new key's.
      await expect(c.store.accept(key, event(1), acceptAt(c.t0 + 10 + RETAIN_MS))).resolves.toEqual(
        { kind: 'released', next: 2, count: 1 },
      );
    });

    it('keeps the state of a closed key retired, answering its later events as closed', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1, 3], c.t0);
      await drainAll(c.store, key, c.t0);
      await c.store.resolveGap(key, 'dead-letter', { openedBefore: c.t0, now: c.t0, close: true });
      await drainAll(c.store, key, c.t0 + 1);

      await expect(c.store.retire(key, RETAIN_MS, c.t0 + 2)).resolves.toBe(true);
      await expect(c.store.accept(key, event(4), acceptAt(c.t0 + 3))).resolves.toEqual({
        kind: 'late',
        next: CLOSED_KEY_NEXT,
        pending: false,
      });
      await expect(c.store.accept(key, event(4), acceptAt(c.t0 + 2 + RETAIN_MS))).resolves.toEqual({
        kind: 'buffered',
        next: 1,
        buffered: 1,
      });
    });

    it('leaves a key holding buffered events, or hand-off items, as it is', async () => {
      const buffering = c.key('k-buffering');
      await acceptAll(c.store, buffering, [1, 3], c.t0);
      await drainAll(c.store, buffering, c.t0);
      const handing = c.key('k-handing');
      await acceptAll(c.store, handing, [1], c.t0);

      await expect(c.store.retire(buffering, RETAIN_MS, c.t0)).resolves.toBe(false);
      await expect(c.store.retire(handing, RETAIN_MS, c.t0)).resolves.toBe(false);
      const later = c.t0 + 2 * RETAIN_MS;
      await expect(c.store.accept(buffering, event(3), acceptAt(later))).resolves.toEqual({
        kind: 'duplicate',
        next: 2,
      });
      const claim = await c.store.claimDrain(handing, drainAt(later));
      expect(claim).toEqual({ kind: 'claimed', items: [{ kind: 'event', entry: event(1) }] });
    });

    it('retires no key without state', async () => {
      await expect(c.store.retire(c.key('k-unknown'), RETAIN_MS, c.t0)).resolves.toBe(false);
      await expect(c.store.inspect(c.key('k-unknown'), 1)).resolves.toEqual({
        next: 1,
        buffered: [],
        handOff: 0,
      });
    });

    it("gives a retired key the store's retention again when it changes", async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      await drainAll(c.store, key, c.t0);
      await c.store.retire(key, RETAIN_MS, c.t0);

      // An event after the end (a change): the key is kept as any other.
      await expect(c.store.accept(key, event(3), acceptAt(c.t0 + 1))).resolves.toEqual({
        kind: 'buffered',
        next: 2,
        buffered: 1,
      });
      await expect(c.store.accept(key, event(2), acceptAt(c.t0 + 1 + RETAIN_MS))).resolves.toEqual({
        kind: 'released',
        next: 4,
        count: 2,
      });
    });

    it('never keeps a key past its ordinary retention', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      await drainAll(c.store, key, c.t0);

      // Later than the last change: a retirement taken for a change would keep the key longer.
      await expect(c.store.retire(key, 2 * c.retentionMs, c.t0 + 1)).resolves.toBe(true);
      await expect(c.store.accept(key, event(1), acceptAt(c.t0 + c.retentionMs))).resolves.toEqual({
        kind: 'released',
        next: 2,
        count: 1,
      });
    });

    it('keeps a key retired through a claim that finds nothing to drain', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      await drainAll(c.store, key, c.t0);
      await expect(c.store.retire(key, RETAIN_MS, c.t0 + 1)).resolves.toBe(true);

      // A drainer that listed the key before (the sweeper's, a waiter's): no change.
      await expect(c.store.claimDrain(key, drainAt(c.t0 + 2))).resolves.toEqual({ kind: 'empty' });
      await expect(c.store.accept(key, event(1), acceptAt(c.t0 + 1 + RETAIN_MS))).resolves.toEqual({
        kind: 'released',
        next: 2,
        count: 1,
      });
    });

    it('keeps the earlier end when a key is retired twice', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      await drainAll(c.store, key, c.t0);
      await c.store.retire(key, RETAIN_MS, c.t0);

      await expect(c.store.retire(key, 3 * RETAIN_MS, c.t0 + 1)).resolves.toBe(true);
      await expect(c.store.accept(key, event(1), acceptAt(c.t0 + RETAIN_MS))).resolves.toEqual({
        kind: 'released',
        next: 2,
        count: 1,
      });
    });

    it('retires one key only, and is seen by every instance', async () => {
      const peer = await c.peer();
      await acceptAll(c.store, c.key('k-a'), [1], c.t0);
      await acceptAll(c.store, c.key('k-b'), [1], c.t0);
      await drainAll(c.store, c.key('k-a'), c.t0);
      await drainAll(c.store, c.key('k-b'), c.t0);

      await expect(peer.retire(c.key('k-a'), RETAIN_MS, c.t0)).resolves.toBe(true);
      const after = acceptAt(c.t0 + RETAIN_MS);
      await expect(c.store.accept(c.key('k-a'), event(1), after)).resolves.toMatchObject({
        kind: 'released',
        next: 2,
      });
      await expect(c.store.accept(c.key('k-b'), event(1), after)).resolves.toEqual({
        kind: 'late',
        next: 2,
        pending: false,
      });
    });
  });
}
