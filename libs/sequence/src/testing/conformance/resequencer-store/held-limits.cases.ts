import { heldEntryBytes } from '../../../ports/resequencer-store.port';
import {
  acceptAt,
  drainAll,
  drainAt,
  event,
  eventSeqs,
  range,
  type ResequencerSuiteContext,
} from './resequencer-suite.context';

/** An event of `size` body bytes (and the usual sequence header). */
function sized(seq: number, size: number) {
  return event(seq, Buffer.alloc(size, seq % 256));
}

/**
 * What a key holds counts against its limits: its buffer and its hand-off list, by events and by
 * bytes; and the bytes of the scope's buffers against the scope's byte limit.
 */
export function describeHeldLimitCases(c: ResequencerSuiteContext): void {
  describe('held limits', () => {
    it('counts the hand-off list against maxBufferedPerKey while nobody drains it', async () => {
      const key = c.key();
      const limits = { maxBufferedPerKey: 3 };
      // A drainer holds the lease and delivers nothing: in-order events pile up in the list.
      await c.store.accept(key, event(1), acceptAt(c.t0, { limits }));
      await c.store.claimDrain(key, drainAt(c.t0, 'stuck'));
      const outcomes = [];
      for (const seq of range(2, 20)) {
        outcomes.push((await c.store.accept(key, event(seq), acceptAt(c.t0, { limits }))).kind);
      }
      expect(outcomes.slice(0, 2)).toEqual(['released', 'released']);
      expect(new Set(outcomes.slice(2))).toEqual(new Set(['full']));
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ next: 4, handOff: 3 });
    });

    it('refuses an event more than maxSeqAhead past next, alone or with others at once', async () => {
      const key = c.key();
      const limits = { maxBufferedPerKey: 100, maxSeqAhead: 5 };
      await expect(c.store.accept(key, event(7), acceptAt(c.t0, { limits }))).resolves.toEqual({
        kind: 'full',
        next: 1,
        limit: 'maxSeqAhead',
      });
      // At once, as a store may take them in one call: each judged against next as it stands.
      const outcomes = await Promise.all(
        [6, 9_000_000, 2, 1].map((seq) =>
          c.store.accept(key, event(seq), acceptAt(c.t0, { limits })),
        ),
      );
      expect(outcomes.map((outcome) => outcome.kind)).toEqual([
        'buffered',
        'full',
        'buffered',
        'released',
      ]);
      // Further along, the bound moves with next.
      await expect(
        c.store.accept(key, event(8), acceptAt(c.t0, { limits })),
      ).resolves.toMatchObject({ kind: 'buffered', next: 3 });
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ buffered: [6, 8] });
    });

    it("names maxBufferedPerKey when the hand-off list refuses the gap's event", async () => {
      const key = c.key();
      const limits = { maxBufferedPerKey: 2 };
      await c.store.accept(key, event(1), acceptAt(c.t0, { limits }));
      await c.store.accept(key, event(2), acceptAt(c.t0, { limits }));
      await expect(c.store.accept(key, event(3), acceptAt(c.t0, { limits }))).resolves.toEqual({
        kind: 'full',
        next: 3,
        limit: 'maxBufferedPerKey',
      });
    });

    it('counts the hand-off list against maxBufferedPerKey for events to buffer', async () => {
      const key = c.key();
      const limits = { maxBufferedPerKey: 2 };
      await c.store.accept(key, event(1), acceptAt(c.t0, { limits }));
      await c.store.accept(key, event(3), acceptAt(c.t0, { limits }));
      await expect(c.store.accept(key, event(4), acceptAt(c.t0, { limits }))).resolves.toEqual({
        kind: 'full',
        next: 2,
        limit: 'maxBufferedPerKey',
      });
    });

    it('takes the next events again once the hand-off list is drained', async () => {
      const key = c.key();
      const limits = { maxBufferedPerKey: 2 };
      await c.store.accept(key, event(1), acceptAt(c.t0, { limits }));
      await c.store.accept(key, event(2), acceptAt(c.t0, { limits }));
      expect(eventSeqs(await drainAll(c.store, key, c.t0 + 1))).toEqual([1, 2]);
      await expect(
        c.store.accept(key, event(3), acceptAt(c.t0 + 2, { limits })),
      ).resolves.toMatchObject({ kind: 'released', next: 4 });
    });

    it('counts bytes of the buffer and the hand-off list in inspect, and frees them as drained', async () => {
      const key = c.key();
      await c.store.accept(key, sized(1, 100), acceptAt(c.t0));
      await c.store.accept(key, sized(3, 1_000), acceptAt(c.t0));
      const held = heldEntryBytes(sized(1, 100)) + heldEntryBytes(sized(3, 1_000));
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ heldBytes: held });
      await drainAll(c.store, key, c.t0 + 1);
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({
        heldBytes: heldEntryBytes(sized(3, 1_000)),
      });
      await c.store.accept(key, sized(2, 10), acceptAt(c.t0 + 2));
      await drainAll(c.store, key, c.t0 + 3);
      await expect(c.store.inspect(key, 1)).resolves.not.toHaveProperty('heldBytes');
    });

    it('counts an empty event its fixed overhead, headers included', () => {
      expect(heldEntryBytes({ seq: 1, body: Buffer.alloc(0), headers: {} })).toBeGreaterThan(0);
      expect(heldEntryBytes({ seq: 1, body: Buffer.alloc(10), headers: { é: 'ab' } })).toBe(
        heldEntryBytes({ seq: 1, body: Buffer.alloc(0), headers: {} }) + 10 + 2 + 2,
      );
    });

    it('refuses to buffer past maxBufferedBytesPerKey, storing nothing', async () => {
      const key = c.key();
      const limits = { maxBufferedBytesPerKey: 2 * heldEntryBytes(sized(2, 500)) };
      await c.store.accept(key, sized(2, 500), acceptAt(c.t0, { limits }));
      await c.store.accept(key, sized(3, 500), acceptAt(c.t0, { limits }));
      await expect(c.store.accept(key, sized(4, 500), acceptAt(c.t0, { limits }))).resolves.toEqual(
        { kind: 'full', next: 1, limit: 'maxBufferedBytesPerKey' },
      );
      // A smaller one still fits nowhere: the bound is full to the byte.
      await expect(c.store.accept(key, sized(5, 0), acceptAt(c.t0, { limits }))).resolves.toEqual({
        kind: 'full',
        next: 1,
        limit: 'maxBufferedBytesPerKey',
      });
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ buffered: [2, 3] });
      // Another key has its own budget.
      await expect(
        c.store.accept(c.key('other'), sized(2, 500), acceptAt(c.t0, { limits })),
      ).resolves.toMatchObject({ kind: 'buffered' });
    });

    it('refuses the first event of a key that holds nothing past maxBufferedBytesPerKey', async () => {
      const key = c.key();
      const limits = { maxBufferedBytesPerKey: heldEntryBytes(sized(2, 500)) - 1 };
      await expect(c.store.accept(key, sized(2, 500), acceptAt(c.t0, { limits }))).resolves.toEqual(
        { kind: 'full', next: 1, limit: 'maxBufferedBytesPerKey' },
      );
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ buffered: [] });
    });

    it('counts the hand-off list against maxBufferedBytesPerKey', async () => {
      const key = c.key();
      const limits = { maxBufferedBytesPerKey: 3 * heldEntryBytes(sized(1, 1_000)) };
      await c.store.accept(key, sized(1, 1_000), acceptAt(c.t0, { limits }));
      await c.store.claimDrain(key, drainAt(c.t0, 'stuck'));
      const kinds = [];
      for (const seq of range(2, 10)) {
        kinds.push((await c.store.accept(key, sized(seq, 1_000), acceptAt(c.t0, { limits }))).kind);
      }
      expect(kinds.filter((kind) => kind === 'released')).toHaveLength(2);
      await expect(
        c.store.accept(key, sized(4, 1_000), acceptAt(c.t0, { limits })),
      ).resolves.toEqual({ kind: 'full', next: 4, limit: 'maxBufferedBytesPerKey' });
      const state = await c.store.inspect(key, 1);
      expect(state.handOff).toBe(3);
      expect(state.heldBytes).toBeLessThanOrEqual(limits.maxBufferedBytesPerKey);
    });

    it('takes the event that fills the gap past the byte limits while the hand-off list is empty', async () => {
      const key = c.key();
      const one = heldEntryBytes(sized(2, 1_000));
      const limits = { maxBufferedBytesPerKey: one, maxBufferedBytesTotal: one };
      await c.store.accept(key, sized(2, 1_000), acceptAt(c.t0, { limits }));
      await expect(
        c.store.accept(key, sized(1, 1_000), acceptAt(c.t0, { limits })),
      ).resolves.toEqual({ kind: 'released', next: 3, count: 2 });
    });

    it('refuses to buffer past maxBufferedBytesTotal across the keys of the scope', async () => {
      const limits = { maxBufferedBytesTotal: 2 * heldEntryBytes(sized(2, 300)) };
      await c.store.accept(c.key('a'), sized(2, 300), acceptAt(c.t0, { limits }));
      await c.store.accept(c.key('b'), sized(2, 300), acceptAt(c.t0, { limits }));
      await expect(
        c.store.accept(c.key('c'), sized(2, 300), acceptAt(c.t0, { limits })),
      ).resolves.toEqual({ kind: 'full', next: 1, limit: 'maxBufferedBytesTotal' });
      await expect(c.store.bufferedBytes(c.scope)).resolves.toBe(limits.maxBufferedBytesTotal);
      // In order, an event is not buffered: the scope's byte limit does not stop it.
      await expect(
        c.store.accept(c.key('c'), sized(1, 300), acceptAt(c.t0, { limits })),
      ).resolves.toMatchObject({ kind: 'released' });
      const other = { scope: `${c.scope}.other`, key: 'c' };
      await expect(
        c.store.accept(other, sized(2, 300), acceptAt(c.t0, { limits })),
      ).resolves.toMatchObject({ kind: 'buffered' });
    });

    it('keeps to the scope limits after a refusal, one event after another', async () => {
      const one = heldEntryBytes(sized(2, 30));
      // On Redis the refusal prunes, and its answer is reused for a moment after: these accepts
      // come within that moment.
      const cases = {
        bytes: { maxBufferedBytesTotal: 5 * one },
        // A byte refusal first, then the event count is the limit reached.
        events: { maxBufferedBytesTotal: 20 * one, maxBufferedTotal: 5 },
      };
      for (const [name, limits] of Object.entries(cases)) {
        const scope = `${c.scope}.${name}`;
        // Alone past the byte limit: refused while nothing is buffered.
        await expect(
          c.store.accept({ scope, key: 'big' }, sized(2, 20 * one), acceptAt(c.t0, { limits })),
        ).resolves.toMatchObject({ kind: 'full', limit: 'maxBufferedBytesTotal' });
        const kinds: string[] = [];
        for (const n of range(1, 15)) {
          const key = { scope, key: `k${n}` };
          kinds.push((await c.store.accept(key, sized(2, 30), acceptAt(c.t0, { limits }))).kind);
        }
        expect(kinds.filter((kind) => kind === 'buffered')).toHaveLength(5);
        await expect(c.store.bufferedTotal(scope)).resolves.toBe(5);
      }
    });

    it('counts the buffered bytes of the scope in bufferedBytes, released or dead-lettered', async () => {
      await expect(c.store.bufferedBytes(c.scope)).resolves.toBe(0);
      await c.store.accept(c.key('a'), sized(2, 100), acceptAt(c.t0));
      await c.store.accept(c.key('a'), sized(3, 200), acceptAt(c.t0));
      await c.store.accept(c.key('b'), sized(5, 400), acceptAt(c.t0));
      const bytes = (seq: number, size: number) => heldEntryBytes(sized(seq, size));
      await expect(c.store.bufferedBytes(c.scope)).resolves.toBe(
        bytes(2, 100) + bytes(3, 200) + bytes(5, 400),
      );
      await c.store.accept(c.key('a'), sized(1, 0), acceptAt(c.t0 + 1));
      await expect(c.store.bufferedBytes(c.scope)).resolves.toBe(bytes(5, 400));
      await c.store.resolveGap(c.key('b'), 'dead-letter', { openedBefore: c.t0, now: c.t0 + 2 });
      await expect(c.store.bufferedBytes(c.scope)).resolves.toBe(0);
      await expect(c.store.inspect(c.key('b'), 1)).resolves.toMatchObject({
        heldBytes: bytes(5, 400),
      });
      await drainAll(c.store, c.key('b'), c.t0 + 3);
      await expect(c.store.inspect(c.key('b'), 1)).resolves.not.toHaveProperty('heldBytes');
    });
  });
}
