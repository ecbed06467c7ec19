import type {
  DrainSettlement,
  HandOffItem,
  ResequencerStore,
} from '../../../ports/resequencer-store.port';
import {
  acceptAt,
  drainAll,
  drainAt,
  event,
  eventSeqs,
  range,
  type ResequencerSuiteContext,
} from './resequencer-suite.context';
import { errorMessage } from '../../../core/errors/caught';

/** Several instances at once, and a property over random arrival orders. */
export function describeConcurrencyCases(c: ResequencerSuiteContext): void {
  describe('concurrency', () => {
    it('releases each sequence once, in order, whatever three instances accept at once', async () => {
      const key = c.key();
      const instances = [c.store, await c.peer(), await c.peer()];
      const count = 60;
      // Every sequence twice, a few three times, in a shuffled order.
      const arrivals = shuffle([
        ...range(1, count),
        ...range(1, count),
        ...range(1, count).filter((seq) => seq % 7 === 0),
      ]);
      const outcomes = await Promise.all(
        arrivals.map((seq, index) =>
          instances[index % instances.length].accept(key, event(seq), acceptAt(c.t0 + index)),
        ),
      );

      const released = outcomes.reduce(
        (sum, outcome) => sum + (outcome.kind === 'released' ? outcome.count : 0),
        0,
      );
      expect(released).toBe(count);
      expect(eventSeqs(await drainAll(instances[1], key, c.t0 + 1_000))).toEqual(range(1, count));
      await expect(c.store.inspect(key, 1)).resolves.toEqual({
        next: count + 1,
        buffered: [],
        handOff: 0,
      });
    });

    it('grants the drain lease to exactly one of several instances claiming at once', async () => {
      const key = c.key();
      await c.store.accept(key, event(1), acceptAt(c.t0));
      const instances = [c.store, await c.peer(), await c.peer()];
      const answers = await Promise.all(
        range(0, 11).map((index) =>
          instances[index % instances.length].claimDrain(key, drainAt(c.t0, `holder-${index}`)),
        ),
      );
      expect(answers.filter((answer) => answer.kind === 'claimed')).toHaveLength(1);
      expect(answers.filter((answer) => answer.kind === 'busy')).toHaveLength(11);
    });

    it('never lets two instances draining at once both hold the lease', async () => {
      const key = c.key();
      const count = 40;
      for (const seq of range(1, count)) await c.store.accept(key, event(seq), acceptAt(c.t0));
      const drainers = [c.store, await c.peer()];
      const delivered: number[] = [];
      let holding = 0;
      let overlapped = false;

      async function drain(store: ResequencerStore, holder: string): Promise<void> {
        const at = drainAt(c.t0 + 1, holder, 3);
        for (let attempt = 0; attempt < 10_000; attempt++) {
          let answer: DrainSettlement = await store.claimDrain(key, at);
          if (answer.kind === 'empty') return;
          while (answer.kind === 'claimed') {
            overlapped ||= ++holding > 1;
            delivered.push(...eventSeqs(answer.items));
            await Promise.resolve();
            holding--;
            answer = await store.settleDrain(key, answer.items.length, at);
          }
          expect(answer.kind).not.toBe('lost');
          if (answer.kind === 'empty') return;
        }
        throw new Error(`${holder} never saw the list empty`);
      }

      await Promise.all(drainers.map((store, index) => drain(store, `drainer-${index}`)));
      expect(overlapped).toBe(false);
      expect(delivered).toEqual(range(1, count));
    });
  });

  describe('random arrivals', () => {
    let run = 0;

    it('drains, per key, exactly the sorted distinct sequences, however they arrive', async () => {
      // Seeded, so that a failing order can be replayed: the seed is in the failure's message.
      const seed = Date.now() >>> 0;
      const random = seededRandom(seed);
      const below = (bound: number) => Math.floor(random() * bound);
      for (let round = 0; round < 25; round++) {
        const sizes = Array.from({ length: 1 + below(3) }, () => 1 + below(12));
        const all = sizes.flatMap((size, key) => range(1, size).map((seq) => [key, seq] as const));
        const duplicates = all.filter(() => random() < 0.5);
        const order = shuffle([...all, ...duplicates], random);
        const keys = sizes.map((_, index) => c.key(`run-${++run}.key-${index}`));
        try {
          for (const [index, [key, seq]] of order.entries()) {
            await c.store.accept(keys[key], event(seq), acceptAt(c.t0 + index));
          }
          for (const [index, key] of keys.entries()) {
            const items: HandOffItem[] = await drainAll(c.store, key, c.t0 + order.length);
            expect(eventSeqs(items)).toEqual(range(1, sizes[index]));
          }
          await expect(c.store.bufferedTotal(c.scope)).resolves.toBe(0);
        } catch (error) {
          throw new Error(
            `seed ${seed}, round ${round}, arrivals ${JSON.stringify(order)}: ${errorMessage(error)}`,
          );
        }
      }
    });
  });
}

/** A small deterministic generator (mulberry32) of numbers in [0, 1). */
function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

/** A Fisher-Yates shuffle (Math.random by default: any order will do, each run tries another). */
function shuffle<T>(items: T[], random: () => number = Math.random): T[] {
  for (let index = items.length - 1; index > 0; index--) {
    const other = Math.floor(random() * (index + 1));
    [items[index], items[other]] = [items[other], items[index]];
  }
  return items;
}
