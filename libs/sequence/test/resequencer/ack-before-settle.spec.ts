import { MemoryResequencerStore } from '../../src/adapters/stores/memory/memory.resequencer-store';
import type { Disposition, Transport } from '../../src/ports/transport.port';
import type { ResequencerStore } from '../../src/ports/resequencer-store.port';
import { Resequencer } from '../../src/resequencer/resequencer';
import { resequencerParts } from './resequencer-parts';

/** A store whose settles wait until the test lets them go, or fail when it says so. */
function withHeldSettles(inner: ResequencerStore) {
  const held: Array<{ go: () => void; fail: (error: Error) => void }> = [];
  const store = new Proxy(inner, {
    get: (target, property) => {
      if (property === 'settleDrain') {
        return (...args: Parameters<ResequencerStore['settleDrain']>) =>
          new Promise<void>((go, fail) => held.push({ go, fail })).then(() =>
            target.settleDrain(...args),
          );
      }
      const value: unknown = Reflect.get(target, property, target);
      return typeof value === 'function' ? (value as () => unknown).bind(target) : value;
    },
  });
  return { store, held };
}

/** Resolves with the promise's value, or with 'pending' if it has not settled by now. */
async function peek<T>(promise: Promise<T>): Promise<T | 'pending'> {
  return Promise.race([
    promise,
    new Promise<'pending'>((resolve) => setImmediate(() => resolve('pending'))),
  ]);
}

const message = (seq: number) => ({
  body: Buffer.from(`#${seq}`),
  headers: { 'x-resequence-key': 'k', 'x-resequence-seq': seq },
});

function setUp(batchSize: number) {
  const inner = new MemoryResequencerStore();
  const { store, held } = withHeldSettles(inner);
  const { definition, deps } = resequencerParts({ tuning: { drain: { batchSize } } });
  const delivered: number[] = [];
  const resequencer = new Resequencer(
    definition,
    { store, ...deps },
    {
      handler: (event) => void delivered.push(event.seq),
      transport: {} as Transport,
      reportGap: async () => undefined,
    },
  );
  return { inner, held, delivered, resequencer };
}

/**
 * The input that releases a run is acked once the run is delivered: the settle that trims the
 * delivered items from the hand-off list need not hold its prefetch slot, since the events are
 * delivered whatever becomes of the settle (a lost one makes the next drain deliver them again).
 */
describe('Resequencer acknowledgement of a releasing input', () => {
  it('acks the input once its run is delivered, before the settle, which goes on after', async () => {
    const { inner, held, delivered, resequencer } = setUp(32);
    await expect(resequencer.receive(message(2))).resolves.toEqual({ action: 'ack' });

    const releasing = resequencer.receive(message(1));
    await expect(releasing).resolves.toEqual({ action: 'ack' });
    expect(delivered).toEqual([1, 2]);
    // Acked while its settle still waits: the items are delivered, not trimmed yet.
    expect(held).toHaveLength(1);
    expect((await inner.inspect({ scope: 'c', key: 'k' }, 1)).handOff).toBe(2);

    let done = false;
    const settled = resequencer.settled().then(() => (done = true));
    expect(await peek(settled)).toBe('pending');
    held[0].go();
    await settled;
    expect(done).toBe(true);
    expect((await inner.inspect({ scope: 'c', key: 'k' }, 1)).handOff).toBe(0);
  });

  it('waits for the settle when the claim may not have been the whole list (batchSize items)', async () => {
    const { held, delivered, resequencer } = setUp(2);
    await resequencer.receive(message(2));

    const releasing: Promise<Disposition> = resequencer.receive(message(1));
    while (held.length === 0) await new Promise((resolve) => setImmediate(resolve));
    expect(delivered).toEqual([1, 2]);
    // Two items, as many as a claim takes: more may wait behind them, so no ack yet.
    expect(await peek(releasing)).toBe('pending');
    held[0].go();
    // The settle answers 'empty' now: the list was whole, and the input is acked.
    await expect(releasing).resolves.toEqual({ action: 'ack' });
  });

  it('delivers the items of a settle that failed after the ack again, in order, on the next drain', async () => {
    const { inner, held, delivered, resequencer } = setUp(32);
    await resequencer.receive(message(2));
    await expect(resequencer.receive(message(1))).resolves.toEqual({ action: 'ack' });
    held[0].fail(new Error('simulated: Redis went away'));
    await resequencer.settled();
    expect((await inner.inspect({ scope: 'c', key: 'k' }, 1)).handOff).toBe(2);

    // The key's next event: the unsettled items go again, before it (at least once, in order).
    const next = resequencer.receive(message(3));
    while (held.length < 2) await new Promise((resolve) => setImmediate(resolve));
    held[1].go();
    await expect(next).resolves.toEqual({ action: 'ack' });
    await resequencer.settled();
    expect(delivered).toEqual([1, 2, 1, 2, 3]);
    expect((await inner.inspect({ scope: 'c', key: 'k' }, 1)).handOff).toBe(0);
  });
});
