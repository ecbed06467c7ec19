import { MemoryResequencerStore } from '../../src/adapters/stores/memory/memory.resequencer-store';
import type { ResequencerStore } from '../../src/ports/resequencer-store.port';
import type { Transport } from '../../src/ports/transport.port';
import { Resequencer } from '../../src/resequencer/resequencer';
import { resequencerParts, sleep } from './resequencer-parts';

/** A store whose first settleDrain fails (a Redis blip mid-step); everything else works. */
function failingFirstSettle(inner: ResequencerStore): ResequencerStore {
  let failed = false;
  return new Proxy(inner, {
    get: (target, property) => {
      if (property === 'settleDrain' && !failed) {
        return (...args: unknown[]) => {
          failed = true;
          void args;
          return Promise.reject(new Error('simulated: connection reset during settle'));
        };
      }
      const value: unknown = Reflect.get(target, property, target);
      return typeof value === 'function' ? (value as () => unknown).bind(target) : value;
    },
  });
}

const event = (seq: number) => ({
  body: Buffer.from(`status ${seq}`),
  headers: { 'x-resequence-key': 'transfer-1', 'x-resequence-seq': seq },
});

/**
 * A key whose hand-off list still holds delivered events (their settle failed after the input
 * was acked, or the process died between the two) is drained by the next event that the list
 * alone keeps out: nothing else would drain it, and the key would refuse every event for good.
 */
describe('Resequencer: a hand-off list left unsettled', () => {
  it("delivers the key's next event after one failed settle, even at maxBufferedPerKey", async () => {
    const store = failingFirstSettle(new MemoryResequencerStore());
    const { definition, deps } = resequencerParts({
      resequencer: { maxBufferedPerKey: 3 },
      tuning: { leaseMs: 300 },
      handlerRetry: { attempts: 1 },
      publish: { confirmTimeoutMs: 100 },
    });
    const delivered: number[] = [];
    const resequencer = new Resequencer(
      definition,
      { store, ...deps },
      {
        handler: async (e) => {
          delivered.push(e.seq);
        },
        transport: {} as Transport,
        reportGap: async () => undefined,
      },
    );

    expect(await resequencer.receive(event(2))).toEqual({ action: 'ack' });
    expect(await resequencer.receive(event(3))).toEqual({ action: 'ack' });
    // 1 fills the gap: 1, 2, 3 are delivered and the input acked; the settle that trims them fails.
    expect(await resequencer.receive(event(1))).toEqual({ action: 'ack' });
    await resequencer.settled();
    expect(delivered).toEqual([1, 2, 3]);

    // The key's next event, redelivered as often as backpressure asks, with sweeps in between
    // (past leaseMs, so any stalled list would be drained).
    let last;
    for (let attempt = 0; attempt < 5; attempt++) {
      last = await resequencer.receive(event(4));
      if (last.action === 'ack') break;
      await sleep(100);
      await resequencer.sweep(Date.now() + 10_000);
    }
    // The items are delivered again, in order, by the key's next drain; then 4.
    expect(last).toEqual({ action: 'ack' });
    expect(delivered.slice(3)).toEqual([1, 2, 3, 4]);
  });
});
