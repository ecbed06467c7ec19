import { Logger } from '@nestjs/common';
import { MemoryResequencerStore } from '../../src/adapters/stores/memory/memory.resequencer-store';
import type { ResequencerMetrics } from '../../src/observability/resequencer.metrics';
import type { ResequencerStore } from '../../src/ports/resequencer-store.port';
import type { Transport } from '../../src/ports/transport.port';
import { Resequencer } from '../../src/resequencer/resequencer';
import {
  resolveDefinition,
  resolveResequencerModuleOptions,
} from '../../src/resequencer/resequencer.options';
import { resolveSequenceOptions } from '../../src/sequence.options';

const LEASE_MS = 150;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * A drainer whose lease renewals fail (Redis slow to answer, an event loop stalled) must stop
 * delivering before its lease can lapse: otherwise the instance that takes the key over and this
 * one deliver the same key at once, out of order.
 */
describe('Resequencer drain lease', () => {
  it('stops a drainer whose renewals fail before another instance can take its key over', async () => {
    const inner = new MemoryResequencerStore();
    const failingRenewals = new Proxy(inner, {
      get: (target, property) => {
        if (property === 'renewDrain') {
          return () => Promise.reject(new Error('simulated: the store did not answer in time'));
        }
        const value: unknown = Reflect.get(target, property, target);
        return typeof value === 'function' ? (value as () => unknown).bind(target) : value;
      },
    }) as ResequencerStore;
    const module = resolveResequencerModuleOptions({ drainBatch: 32 });
    const sequence = resolveSequenceOptions({ leaseMs: LEASE_MS, handlerRetry: { attempts: 1 } }, {
      maxMessageBytes: 1_000_000,
    } as Transport);
    const definition = resolveDefinition(
      'test',
      { channel: 'c', gap: { timeoutMs: 60_000, policy: 'alert' } },
      module,
      sequence,
      (channel) => `${channel}.dlq`,
    );
    const logger = new Logger('test');
    jest.spyOn(logger, 'warn').mockImplementation(() => undefined);
    const metrics = new Proxy({}, { get: () => () => undefined }) as ResequencerMetrics;
    const delivered: Array<{ by: string; seq: number }> = [];
    // A's renewals fail; B, the instance that takes the key over, reaches the store fine.
    const instance = (by: string, store: ResequencerStore) =>
      new Resequencer(
        definition,
        { store, module, sequence, metrics, logger },
        {
          handler: async (event) => {
            await sleep(40);
            delivered.push({ by, seq: event.seq });
          },
          transport: {} as Transport,
          reportGap: async () => undefined,
        },
      );
    for (let seq = 1; seq <= 8; seq++) {
      await inner.accept(
        { scope: 'c', key: 'k' },
        { seq, body: Buffer.from(`#${seq}`), headers: {} },
        { start: 1, limits: { maxBufferedPerKey: 100, maxBufferedTotal: 100 }, now: Date.now() },
      );
    }

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
});
