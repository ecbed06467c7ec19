import { MemoryResequencerStore } from '../../src/adapters/stores/memory/memory.resequencer-store';
import type { ResequencerStore } from '../../src/ports/resequencer-store.port';
import type { Transport } from '../../src/ports/transport.port';
import { Resequencer } from '../../src/resequencer/resequencer';
import { resolveResequencerDefinition } from '../../src/options/resolve-resequencer';
import { resequencerParts, resolvedOptions, sleep } from './resequencer-parts';

const LEASE_MS = 150;

/** A store whose drain-lease renewals all fail: the holder cannot keep its lease. */
function withFailingRenewals(inner: ResequencerStore): ResequencerStore {
  return new Proxy(inner, {
    get: (target, property) => {
      if (property === 'renewDrain') {
        return () => Promise.reject(new Error('simulated: the store did not answer in time'));
      }
      const value: unknown = Reflect.get(target, property, target);
      return typeof value === 'function' ? (value as () => unknown).bind(target) : value;
    },
  });
}

async function acceptInOrder(store: ResequencerStore, count: number): Promise<void> {
  for (let seq = 1; seq <= count; seq++) {
    await store.accept(
      { scope: 'c', key: 'k' },
      { seq, body: Buffer.from(`#${seq}`), headers: { 'x-resequence-seq': seq } },
      { start: 1, limits: { maxBufferedPerKey: 100, maxBufferedTotal: 100 }, now: Date.now() },
    );
  }
}

/**
 * A drainer whose lease renewals fail (Redis slow to answer, an event loop stalled) must stop
 * delivering before its lease can lapse: otherwise the instance that takes the key over and this
 * one deliver the same key at once, out of order.
 */
describe('Resequencer drain lease', () => {
  it('stops a drainer whose renewals fail before another instance can take its key over', async () => {
    const inner = new MemoryResequencerStore();
    const failingRenewals = withFailingRenewals(inner);
    const { definition, deps } = resequencerParts({
      tuning: { leaseMs: LEASE_MS },
      handlerRetry: { attempts: 1 },
      publish: { confirmTimeoutMs: 60 },
    });
    const delivered: Array<{ by: string; seq: number }> = [];
    // A's renewals fail; B, the instance that takes the key over, reaches the store fine.
    const instance = (by: string, store: ResequencerStore) =>
      new Resequencer(
        definition,
        { store, ...deps },
        {
          handler: async (event) => {
            await sleep(40);
            delivered.push({ by, seq: event.seq });
          },
          transport: {} as Transport,
          reportGap: async () => undefined,
        },
      );
    await acceptInOrder(inner, 8);

    const first = instance('A', failingRenewals).drain('k');
    await sleep(LEASE_MS + 50); // A's lease has lapsed: its renewals failed
    const second = instance('B', inner).drain('k');

    await expect(first).resolves.toBe('lost');
    await expect(second).resolves.toBe('drained');
    const seqs = delivered.map((each) => each.seq);
    // One key, one drainer at a time: never interleaved, never out of order, nothing missing.
    expect(seqs).toEqual([...seqs].sort((a, b) => a - b));
    expect(new Set(seqs)).toEqual(new Set([1, 2, 3, 4, 5, 6, 7, 8]));
    expect(delivered.some((each) => each.by === 'B')).toBe(true);
  });

  it('makes no publish attempt that could be confirmed after its lease may have passed on, whatever the retries left', async () => {
    const lease = 300;
    const inner = new MemoryResequencerStore();
    // Attempts of 100 ms at most, and retries enough to outlast the lease many times over.
    const { definition, deps } = resequencerParts(
      {
        tuning: { leaseMs: lease },
        publish: {
          confirmTimeoutMs: 100,
          retry: { attempts: 50, baseDelayMs: 10, maxDelayMs: 20 },
        },
      },
      'out',
    );
    const output: number[] = [];
    const startedAt = Date.now();
    // A's broker link: each attempt fails after 50 ms until long after its lease ran out, then
    // works; B's works.
    const transportOf = (failUntil: number): Transport =>
      ({
        publish: async (_channel: string, _body: Buffer, headers: Record<string, unknown>) => {
          await sleep(50);
          if (Date.now() < failUntil) throw new Error('simulated: no confirm');
          output.push(Number(headers['x-resequence-seq']));
        },
      }) as unknown as Transport;
    const instance = (store: ResequencerStore, transport: Transport) =>
      new Resequencer(
        definition,
        { store, ...deps },
        { transport, reportGap: async () => undefined },
      );
    await acceptInOrder(inner, 5);

    const first = instance(withFailingRenewals(inner), transportOf(startedAt + lease + 150)).drain(
      'k',
    );
    await sleep(lease + 50); // A's lease has lapsed in the store: B takes the key over
    const second = instance(inner, transportOf(0)).drain('k');

    await expect(second).resolves.toBe('drained');
    await first;
    // Before, A kept retrying event 1 past its lease, and its retry landed after B's 1..5.
    expect(output).toEqual([1, 2, 3, 4, 5]);
  });

  it('refuses a confirm timeout a publish attempt could not fit in the lease', () => {
    const options = resolvedOptions({ tuning: { leaseMs: 3_000 } });
    expect(() =>
      resolveResequencerDefinition(
        'test',
        { channel: 'c', output: 'out', gap: { timeoutMs: 1_000, policy: 'alert' } },
        options,
        (channel) => `${channel}.dlq`,
      ),
    ).toThrow(
      /publish.confirmTimeoutMs \(10000\) must be at most 2\/5 of tuning.leaseMs \(3000\), that is 1200 ms/,
    );
  });
});
