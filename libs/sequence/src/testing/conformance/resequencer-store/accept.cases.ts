import { heldEntryBytes } from '../../../ports/resequencer-store.port';
import {
  acceptAll,
  acceptAt,
  drainAll,
  drainAt,
  event,
  eventSeqs,
  range,
  type ResequencerSuiteContext,
} from './resequencer-suite.context';

/** `accept`: in order, out of order, duplicates, starts, isolation and limits. */
export function describeAcceptCases(c: ResequencerSuiteContext): void {
  describe('accept', () => {
    it('releases events that arrive in order, one at a time', async () => {
      const key = c.key();
      for (const seq of [1, 2, 3]) {
        await expect(c.store.accept(key, event(seq), acceptAt(c.t0))).resolves.toEqual({
          kind: 'released',
          next: seq + 1,
          count: 1,
        });
      }
      expect(eventSeqs(await drainAll(c.store, key, c.t0 + 1))).toEqual([1, 2, 3]);
    });

    it('buffers events ahead of next, counting the key buffer', async () => {
      const key = c.key();
      await expect(c.store.accept(key, event(3), acceptAt(c.t0))).resolves.toEqual({
        kind: 'buffered',
        next: 1,
        buffered: 1,
      });
      await expect(c.store.accept(key, event(5), acceptAt(c.t0))).resolves.toEqual({
        kind: 'buffered',
        next: 1,
        buffered: 2,
      });
      await expect(c.store.claimDrain(key, drainAt(c.t0))).resolves.toEqual({
        kind: 'empty',
      });
    });

    it('releases the event that fills a gap with the contiguous run behind it, and no further', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [2, 3, 5, 6], c.t0);
      await expect(c.store.accept(key, event(1), acceptAt(c.t0 + 1))).resolves.toEqual({
        kind: 'released',
        next: 4,
        count: 3,
      });
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ next: 4, buffered: [5, 6] });
      await expect(c.store.accept(key, event(4), acceptAt(c.t0 + 2))).resolves.toEqual({
        kind: 'released',
        next: 7,
        count: 3,
      });
      expect(eventSeqs(await drainAll(c.store, key, c.t0 + 3))).toEqual(range(1, 6));
    });

    it('drops a second copy of a buffered sequence as a duplicate, keeping the first body', async () => {
      const key = c.key();
      await c.store.accept(key, event(2, Buffer.from('first')), acceptAt(c.t0));
      await expect(
        c.store.accept(key, event(2, Buffer.from('second')), acceptAt(c.t0 + 1)),
      ).resolves.toEqual({ kind: 'duplicate', next: 1 });
      await c.store.accept(key, event(1), acceptAt(c.t0 + 2));

      const items = await drainAll(c.store, key, c.t0 + 3);
      expect(items).toHaveLength(2);
      expect(items[1]).toMatchObject({ kind: 'event', entry: { seq: 2 } });
      expect(items[1].kind === 'event' && items[1].entry.body.toString()).toBe('first');
    });

    it('answers late, pending while undelivered, to a sequence released already', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1, 2], c.t0);
      await expect(c.store.accept(key, event(1), acceptAt(c.t0 + 1))).resolves.toEqual({
        kind: 'late',
        next: 3,
        pending: true,
      });
      await drainAll(c.store, key, c.t0 + 2);
      await expect(c.store.accept(key, event(2), acceptAt(c.t0 + 3))).resolves.toEqual({
        kind: 'late',
        next: 3,
        pending: false,
      });
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ next: 3, handOff: 0 });
    });

    it('starts a key at context.start: 0 is a first sequence like any other', async () => {
      const key = c.key();
      await expect(c.store.accept(key, event(1), acceptAt(c.t0, { start: 0 }))).resolves.toEqual({
        kind: 'buffered',
        next: 0,
        buffered: 1,
      });
      await expect(c.store.accept(key, event(0), acceptAt(c.t0, { start: 0 }))).resolves.toEqual({
        kind: 'released',
        next: 2,
        count: 2,
      });
      expect(eventSeqs(await drainAll(c.store, key, c.t0 + 1))).toEqual([0, 1]);
    });

    it('treats sequences below a start of 5 as late, and releases from 5', async () => {
      const key = c.key();
      const at = acceptAt(c.t0, { start: 5 });
      await expect(c.store.accept(key, event(4), at)).resolves.toEqual({
        kind: 'late',
        next: 5,
        pending: false,
      });
      await expect(c.store.accept(key, event(6), at)).resolves.toMatchObject({ kind: 'buffered' });
      await expect(c.store.accept(key, event(5), at)).resolves.toEqual({
        kind: 'released',
        next: 7,
        count: 2,
      });
    });

    it('keeps keys independent: one key releasing does not advance another', async () => {
      const [a, b] = [c.key('a'), c.key('b')];
      await acceptAll(c.store, a, [1, 2, 3], c.t0);
      await expect(c.store.accept(b, event(2), acceptAt(c.t0))).resolves.toEqual({
        kind: 'buffered',
        next: 1,
        buffered: 1,
      });
      await expect(c.store.inspect(b, 1)).resolves.toMatchObject({ next: 1, handOff: 0 });
      expect(eventSeqs(await drainAll(c.store, a, c.t0 + 1))).toEqual([1, 2, 3]);
      await expect(c.store.claimDrain(b, drainAt(c.t0))).resolves.toEqual({ kind: 'empty' });
    });

    it('keeps scopes independent: the same key in two scopes is two keys', async () => {
      const key = c.key('shared');
      const other = { scope: `${c.scope}.other`, key: key.key };
      await acceptAll(c.store, key, [1, 3], c.t0);
      await expect(c.store.accept(other, event(1), acceptAt(c.t0))).resolves.toEqual({
        kind: 'released',
        next: 2,
        count: 1,
      });
      await expect(c.store.bufferedTotal(c.scope)).resolves.toBe(1);
      await expect(c.store.bufferedTotal(other.scope)).resolves.toBe(0);
      await expect(c.store.listGaps(other.scope, c.t0 + 1, 10)).resolves.toEqual([]);
      expect(eventSeqs(await drainAll(c.store, other, c.t0 + 1))).toEqual([1]);
      expect(eventSeqs(await drainAll(c.store, key, c.t0 + 1))).toEqual([1]);
    });

    it('copies the body: the caller reusing its buffer after accept changes nothing stored', async () => {
      const key = c.key();
      const body = Buffer.from('original');
      await c.store.accept(key, event(1, body), acceptAt(c.t0));
      body.fill(0);
      const [item] = await drainAll(c.store, key, c.t0 + 1);
      expect(item.kind === 'event' && item.entry.body.toString()).toBe('original');
    });

    describe('limits', () => {
      it('refuses to buffer past maxBufferedPerKey, storing nothing', async () => {
        const key = c.key();
        const limits = { maxBufferedPerKey: 2 };
        await c.store.accept(key, event(2), acceptAt(c.t0, { limits }));
        await c.store.accept(key, event(3), acceptAt(c.t0, { limits }));
        await expect(c.store.accept(key, event(4), acceptAt(c.t0, { limits }))).resolves.toEqual({
          kind: 'full',
          next: 1,
          limit: 'maxBufferedPerKey',
        });
        await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ buffered: [2, 3] });
      });

      it('still answers duplicate, not full, for a buffered sequence when the buffer is full', async () => {
        const key = c.key();
        const limits = { maxBufferedPerKey: 1 };
        await c.store.accept(key, event(2), acceptAt(c.t0, { limits }));
        await expect(c.store.accept(key, event(2), acceptAt(c.t0, { limits }))).resolves.toEqual({
          kind: 'duplicate',
          next: 1,
        });
      });

      it('counts maxBufferedPerKey per key', async () => {
        const limits = { maxBufferedPerKey: 1 };
        await c.store.accept(c.key('a'), event(2), acceptAt(c.t0, { limits }));
        await expect(
          c.store.accept(c.key('b'), event(2), acceptAt(c.t0, { limits })),
        ).resolves.toMatchObject({ kind: 'buffered' });
      });

      it('refuses to buffer past maxBufferedTotal across the keys of the scope', async () => {
        const limits = { maxBufferedTotal: 2 };
        await c.store.accept(c.key('a'), event(2), acceptAt(c.t0, { limits }));
        await c.store.accept(c.key('b'), event(2), acceptAt(c.t0, { limits }));
        await expect(
          c.store.accept(c.key('c'), event(2), acceptAt(c.t0, { limits })),
        ).resolves.toEqual({ kind: 'full', next: 1, limit: 'maxBufferedTotal' });
        const other = { scope: `${c.scope}.other`, key: 'c' };
        await expect(c.store.accept(other, event(2), acceptAt(c.t0, { limits }))).resolves.toEqual({
          kind: 'buffered',
          next: 1,
          buffered: 1,
        });
      });

      it('takes the event that fills the gap even when both limits are reached', async () => {
        const key = c.key();
        const limits = { maxBufferedPerKey: 2, maxBufferedTotal: 2 };
        await c.store.accept(key, event(2), acceptAt(c.t0, { limits }));
        await c.store.accept(key, event(3), acceptAt(c.t0, { limits }));
        await expect(c.store.accept(key, event(1), acceptAt(c.t0, { limits }))).resolves.toEqual({
          kind: 'released',
          next: 4,
          count: 3,
        });
        await expect(c.store.bufferedTotal(c.scope)).resolves.toBe(0);
        await expect(
          c.store.accept(c.key('b'), event(1), acceptAt(c.t0, { limits })),
        ).resolves.toMatchObject({ kind: 'released' });
      });

      it('frees room as released events are drained', async () => {
        const key = c.key();
        const limits = { maxBufferedPerKey: 1 };
        await c.store.accept(key, event(2), acceptAt(c.t0, { limits }));
        await c.store.accept(key, event(1), acceptAt(c.t0, { limits }));
        await drainAll(c.store, key, c.t0 + 1);
        await expect(c.store.accept(key, event(4), acceptAt(c.t0, { limits }))).resolves.toEqual({
          kind: 'buffered',
          next: 3,
          buffered: 1,
        });
      });
    });

    it('counts the buffered events of the scope in bufferedTotal', async () => {
      await expect(c.store.bufferedTotal(c.scope)).resolves.toBe(0);
      await acceptAll(c.store, c.key('a'), [2, 3, 5], c.t0);
      await acceptAll(c.store, c.key('b'), [4], c.t0);
      await expect(c.store.bufferedTotal(c.scope)).resolves.toBe(4);
      await c.store.accept(c.key('a'), event(1), acceptAt(c.t0 + 1));
      await expect(c.store.bufferedTotal(c.scope)).resolves.toBe(2);
    });

    it('shows a key in inspect: next, buffered ascending, hand-off length and gapSince', async () => {
      const key = c.key();
      await expect(c.store.inspect(key, 7)).resolves.toEqual({ next: 7, buffered: [], handOff: 0 });
      await c.store.accept(key, event(1), acceptAt(c.t0));
      await c.store.accept(key, event(9), acceptAt(c.t0 + 5));
      await c.store.accept(key, event(4), acceptAt(c.t0 + 6));
      await expect(c.store.inspect(key, 1)).resolves.toEqual({
        next: 2,
        buffered: [4, 9],
        handOff: 1,
        gapSince: c.t0 + 5,
        heldBytes: [1, 4, 9].reduce((sum, seq) => sum + heldEntryBytes(event(seq)), 0),
      });
    });
  });
}
