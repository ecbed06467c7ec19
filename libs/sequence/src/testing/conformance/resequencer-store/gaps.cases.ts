import {
  CLOSED_KEY_NEXT,
  heldEntryBytes,
  MAX_SEQUENCE_NUMBER,
  type HandOffItem,
  type ResequencerKey,
  type SkippedGap,
} from '../../../ports/resequencer-store.port';
import {
  acceptAll,
  acceptAt,
  drainAll,
  event,
  eventSeqs,
  range,
  type ResequencerSuiteContext,
} from './resequencer-suite.context';

/** `listGaps` and the three `resolveGap` policies. */
export function describeGapCases(c: ResequencerSuiteContext): void {
  describe('gaps', () => {
    it('lists a key with a buffer as a gap opened when its buffer went from empty to not', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [3], c.t0);
      await acceptAll(c.store, key, [5], c.t0 + 10);
      await expect(c.store.listGaps(c.scope, c.t0 + 100, 10)).resolves.toEqual([
        { key: key.key, expected: 1, buffered: 2, lowest: 3, gapSince: c.t0, alerted: false },
      ]);
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ gapSince: c.t0 });
    });

    it('does not list a gap opened after openedBefore', async () => {
      await acceptAll(c.store, c.key(), [3], c.t0);
      await expect(c.store.listGaps(c.scope, c.t0 - 1, 10)).resolves.toEqual([]);
    });

    it('reopens the gap at the time of a release that leaves the buffer not empty', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [2, 4], c.t0);
      await acceptAll(c.store, key, [1], c.t0 + 50);
      await expect(c.store.listGaps(c.scope, c.t0 + 49, 10)).resolves.toEqual([]);
      await expect(c.store.listGaps(c.scope, c.t0 + 50, 10)).resolves.toEqual([
        { key: key.key, expected: 3, buffered: 1, lowest: 4, gapSince: c.t0 + 50, alerted: false },
      ]);
    });

    it('forgets a gap once it fills', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [2, 3, 1], c.t0);
      await expect(c.store.listGaps(c.scope, c.t0 + 100, 10)).resolves.toEqual([]);
      const state = await c.store.inspect(key, 1);
      expect(state.gapSince).toBeUndefined();
      await expect(c.store.resolveGap(key, 'skip', at(c.t0 + 100))).resolves.toEqual({
        kind: 'none',
      });
    });

    it('lists gaps oldest first, up to limit, within the scope only', async () => {
      const names = ['g-late', 'g-early', 'g-middle'];
      const times = [c.t0 + 30, c.t0 + 10, c.t0 + 20];
      for (const [index, name] of names.entries()) {
        await acceptAll(c.store, c.key(name), [2], times[index]);
      }
      await acceptAll(c.store, { scope: `${c.scope}.other`, key: 'g-other' }, [2], c.t0);
      const all = await c.store.listGaps(c.scope, c.t0 + 100, 10);
      expect(all.map((gap) => gap.key)).toEqual(['g-early', 'g-middle', 'g-late']);
      const two = await c.store.listGaps(c.scope, c.t0 + 100, 2);
      expect(two.map((gap) => gap.key)).toEqual(['g-early', 'g-middle']);
    });

    it('resolves nothing for a key without a buffer, or whose gap opened after openedBefore', async () => {
      const key = c.key();
      await expect(c.store.resolveGap(key, 'alert', at(c.t0))).resolves.toEqual({ kind: 'none' });
      await acceptAll(c.store, key, [2], c.t0);
      for (const policy of ['alert', 'skip', 'dead-letter'] as const) {
        await expect(
          c.store.resolveGap(key, policy, { openedBefore: c.t0 - 1, now: c.t0 + 100 }),
        ).resolves.toEqual({
          kind: 'none',
        });
      }
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ next: 1, buffered: [2] });
    });

    describe("policy 'alert'", () => {
      it('appends a gap-alert, keeps the buffer, and stops listing the gap as due (it stays listed as alerted)', async () => {
        const key = c.key();
        await acceptAll(c.store, key, [3, 4], c.t0);
        await expect(c.store.resolveGap(key, 'alert', at(c.t0 + 100))).resolves.toEqual({
          kind: 'resolved',
          policy: 'alert',
          appended: 1,
        });
        await expect(c.store.listGaps(c.scope, c.t0 + 100, 10)).resolves.toEqual([]);
        await expect(c.store.listGaps(c.scope, c.t0 + 100, 10, true)).resolves.toEqual([
          { key: key.key, expected: 1, buffered: 2, lowest: 3, gapSince: c.t0, alerted: true },
        ]);
        await expect(c.store.listGaps(c.scope, c.t0 - 1, 10, true)).resolves.toEqual([]);
        await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ buffered: [3, 4] });
        expect(await drainAll(c.store, key, c.t0 + 101)).toEqual<HandOffItem[]>([
          { kind: 'gap-alert', expected: 1, buffered: 2, gapSince: c.t0 },
        ]);
      });

      it('lists alerted and not alerted gaps together when asked, oldest first, up to limit', async () => {
        const times = { 'a-old': c.t0 + 10, 'b-mid': c.t0 + 20, 'c-new': c.t0 + 30 };
        for (const [name, time] of Object.entries(times)) {
          await acceptAll(c.store, c.key(name), [2], time);
        }
        await c.store.resolveGap(c.key('a-old'), 'alert', at(c.t0 + 100));
        await c.store.resolveGap(c.key('c-new'), 'alert', at(c.t0 + 100));

        const all = await c.store.listGaps(c.scope, c.t0 + 100, 10, true);
        expect(all.map((gap) => [gap.key, gap.gapSince, gap.alerted])).toEqual([
          ['a-old', c.t0 + 10, true],
          ['b-mid', c.t0 + 20, false],
          ['c-new', c.t0 + 30, true],
        ]);
        const two = await c.store.listGaps(c.scope, c.t0 + 100, 2, true);
        expect(two.map((gap) => gap.key)).toEqual(['a-old', 'b-mid']);
        const opened = await c.store.listGaps(c.scope, c.t0 + 25, 10, true);
        expect(opened.map((gap) => gap.key)).toEqual(['a-old', 'b-mid']);
        const due = await c.store.listGaps(c.scope, c.t0 + 100, 10);
        expect(due.map((gap) => gap.key)).toEqual(['b-mid']);
      });

      it('orders gaps opened at the same time by key, alerted or not, also where limit cuts', async () => {
        for (const name of ['t-d', 't-c', 't-b', 't-a']) {
          await acceptAll(c.store, c.key(name), [2], c.t0);
        }
        await c.store.resolveGap(c.key('t-a'), 'alert', at(c.t0 + 100));
        await c.store.resolveGap(c.key('t-c'), 'alert', at(c.t0 + 100));

        const all = await c.store.listGaps(c.scope, c.t0 + 100, 10, true);
        expect(all.map((gap) => [gap.key, gap.alerted])).toEqual([
          ['t-a', true],
          ['t-b', false],
          ['t-c', true],
          ['t-d', false],
        ]);
        const two = await c.store.listGaps(c.scope, c.t0 + 100, 2, true);
        expect(two.map((gap) => gap.key)).toEqual(['t-a', 't-b']);
        const due = await c.store.listGaps(c.scope, Number.MAX_SAFE_INTEGER, 10);
        expect(due.map((gap) => gap.key)).toEqual(['t-b', 't-d']);
      });

      it('forgets an alerted gap once it fills', async () => {
        const key = c.key();
        await acceptAll(c.store, key, [2], c.t0);
        await c.store.resolveGap(key, 'alert', at(c.t0 + 100));
        await acceptAll(c.store, key, [1], c.t0 + 200);
        await expect(c.store.listGaps(c.scope, c.t0 + 300, 10, true)).resolves.toEqual([]);
      });

      it('alerts a gap once, until a new gap opens', async () => {
        const key = c.key();
        await acceptAll(c.store, key, [2, 4], c.t0);
        await c.store.resolveGap(key, 'alert', at(c.t0 + 100));
        await expect(c.store.resolveGap(key, 'alert', at(c.t0 + 200))).resolves.toEqual({
          kind: 'none',
        });

        await acceptAll(c.store, key, [1], c.t0 + 300);
        await expect(c.store.listGaps(c.scope, c.t0 + 300, 10)).resolves.toMatchObject([
          { key: key.key, expected: 3, gapSince: c.t0 + 300, alerted: false },
        ]);
        await expect(c.store.resolveGap(key, 'alert', at(c.t0 + 400))).resolves.toMatchObject({
          kind: 'resolved',
        });
      });

      it('alerts a gap once when instances resolve it at once and again later, the clock moving on', async () => {
        const key = c.key();
        await acceptAll(c.store, key, [3, 4], c.t0);
        const instances = [c.store, await c.peer(), await c.peer()];
        // Overlapping sweeps of three instances, then later ones, each with a later clock and a
        // later openedBefore: the gap is due in every one of them.
        const resolutions = [];
        for (let round = 0; round < 3; round++) {
          const now = c.t0 + 1_000 * (round + 1);
          resolutions.push(
            ...(await Promise.all(
              range(0, 5).map((index) =>
                instances[index % instances.length].resolveGap(key, 'alert', at(now + index)),
              ),
            )),
          );
        }
        expect(resolutions.filter((resolution) => resolution.kind === 'resolved')).toEqual([
          { kind: 'resolved', policy: 'alert', appended: 1 },
        ]);
        await expect(c.store.listGaps(c.scope, c.t0 + 10_000, 10)).resolves.toEqual([]);
        expect(await drainAll(instances[1], key, c.t0 + 10_000)).toEqual<HandOffItem[]>([
          { kind: 'gap-alert', expected: 1, buffered: 2, gapSince: c.t0 },
        ]);
        // Drained, the key still waits on the same gap: no later sweep alerts it again.
        await expect(c.store.resolveGap(key, 'alert', at(c.t0 + 20_000))).resolves.toEqual({
          kind: 'none',
        });
        await expect(c.store.listGaps(c.scope, c.t0 + 20_000, 10, true)).resolves.toEqual([
          { key: key.key, expected: 1, buffered: 2, lowest: 3, gapSince: c.t0, alerted: true },
        ]);
      });

      it('still lets an alerted gap be skipped or dead-lettered', async () => {
        const key = c.key();
        await acceptAll(c.store, key, [3], c.t0);
        await c.store.resolveGap(key, 'alert', at(c.t0 + 100));
        await expect(c.store.resolveGap(key, 'skip', at(c.t0 + 200))).resolves.toEqual({
          kind: 'resolved',
          policy: 'skip',
          appended: 2,
          skipped: { from: 1, to: 2, gapSince: c.t0 },
        });
      });
    });

    describe("policy 'skip'", () => {
      /**
       * Skips the key's gap at t0 + 100, expecting it to give up `skipped` (answered, and as its
       * `gap-skipped` item says); answers the items it appended, drained.
       */
      async function skips(key: ResequencerKey, skipped: SkippedGap): Promise<HandOffItem[]> {
        const resolution = await c.store.resolveGap(key, 'skip', at(c.t0 + 100));
        const items = await drainAll(c.store, key, c.t0 + 101);
        expect(resolution).toEqual({
          kind: 'resolved',
          policy: 'skip',
          appended: items.length,
          skipped,
        });
        expect(items[0]).toEqual({ kind: 'gap-skipped', from: skipped.from, to: skipped.to });
        return items;
      }

      it('gives up next..lowest-1 and releases the contiguous run from the lowest', async () => {
        const key = c.key();
        await acceptAll(c.store, key, [4, 5, 7], c.t0);
        const items = await skips(key, { from: 1, to: 3, gapSince: c.t0 });
        expect(eventSeqs(items)).toEqual([4, 5]);
        await expect(c.store.inspect(key, 1)).resolves.toEqual({
          next: 6,
          buffered: [7],
          handOff: 0,
          gapSince: c.t0 + 100,
          heldBytes: heldEntryBytes(event(7)),
        });
      });

      it('answers the range it gave up as the key is then, not as it was listed', async () => {
        const key = c.key();
        await acceptAll(c.store, key, [5], c.t0);
        const [listed] = await c.store.listGaps(c.scope, c.t0 + 100, 10);
        expect(listed).toMatchObject({ expected: 1, lowest: 5 });
        await acceptAll(c.store, key, [3], c.t0 + 50);
        const items = await skips(key, { from: 1, to: 2, gapSince: c.t0 });
        expect(eventSeqs(items)).toEqual([3]);
      });

      it('opens a new, unalerted gap when events stay buffered', async () => {
        const key = c.key();
        await acceptAll(c.store, key, [2, 4], c.t0);
        await c.store.resolveGap(key, 'alert', at(c.t0 + 50));
        await c.store.resolveGap(key, 'skip', at(c.t0 + 100));
        await expect(c.store.listGaps(c.scope, c.t0 + 100, 10)).resolves.toEqual([
          {
            key: key.key,
            expected: 3,
            buffered: 1,
            lowest: 4,
            gapSince: c.t0 + 100,
            alerted: false,
          },
        ]);
      });

      it('answers late to a skipped sequence arriving afterwards', async () => {
        const key = c.key();
        await acceptAll(c.store, key, [3], c.t0);
        await c.store.resolveGap(key, 'skip', at(c.t0 + 100));
        await expect(c.store.accept(key, event(2), acceptAt(c.t0 + 200))).resolves.toEqual({
          kind: 'late',
          next: 4,
          pending: true,
        });
        await expect(c.store.bufferedTotal(c.scope)).resolves.toBe(0);
      });
    });

    describe("policy 'dead-letter'", () => {
      it('moves every buffered event out in order, and next past the highest', async () => {
        const key = c.key();
        await acceptAll(c.store, key, [6, 3, 4], c.t0);
        await expect(c.store.resolveGap(key, 'dead-letter', at(c.t0 + 100))).resolves.toEqual({
          kind: 'resolved',
          policy: 'dead-letter',
          appended: 3,
        });
        expect(await drainAll(c.store, key, c.t0 + 101)).toEqual<HandOffItem[]>(
          [3, 4, 6].map((seq) => ({ kind: 'dead-letter', entry: event(seq), expected: 1 })),
        );
        await expect(c.store.inspect(key, 1)).resolves.toEqual({
          next: 7,
          buffered: [],
          handOff: 0,
        });
        await expect(c.store.listGaps(c.scope, c.t0 + 1_000, 10)).resolves.toEqual([]);
        await expect(c.store.bufferedTotal(c.scope)).resolves.toBe(0);
        await expect(c.store.accept(key, event(7), acceptAt(c.t0 + 200))).resolves.toEqual({
          kind: 'released',
          next: 8,
          count: 1,
        });
      });
    });

    it('appends gap items after the events released before them', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1, 3], c.t0);
      await c.store.resolveGap(key, 'skip', at(c.t0 + 100));
      const items = await drainAll(c.store, key, c.t0 + 101);
      expect(items.map((item) => item.kind)).toEqual(['event', 'gap-skipped', 'event']);
      expect(eventSeqs(items)).toEqual([1, 3]);
    });

    it("closes the key with 'dead-letter' and close: every later event from the missing one on is late", async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1, 3, 4], c.t0);
      await expect(
        c.store.resolveGap(key, 'dead-letter', { ...at(c.t0 + 100), close: true }),
      ).resolves.toEqual({ kind: 'resolved', policy: 'dead-letter', appended: 2 });
      const items = await drainAll(c.store, key, c.t0 + 101);
      expect(items.map((item) => item.kind)).toEqual(['event', 'dead-letter', 'dead-letter']);
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ next: CLOSED_KEY_NEXT });

      // The missing 2, the dead-lettered 3 and 4, and anything after: refused by the close.
      for (const seq of [2, 4, 5, MAX_SEQUENCE_NUMBER]) {
        await expect(c.store.accept(key, event(seq), acceptAt(c.t0 + 200))).resolves.toEqual({
          kind: 'late',
          next: CLOSED_KEY_NEXT,
          pending: false,
        });
      }
      // A repeat of 1, released before: a plain late event.
      await expect(c.store.accept(key, event(1), acceptAt(c.t0 + 200))).resolves.toEqual({
        kind: 'late',
        next: 2,
        pending: false,
      });
      await expect(c.store.listGaps(c.scope, c.t0 + 1_000, 10)).resolves.toEqual([]);
    });
  });
}

function at(now: number): { openedBefore: number; now: number } {
  return { openedBefore: now, now };
}
