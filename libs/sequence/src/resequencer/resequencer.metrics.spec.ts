import type { INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import type { Registry } from 'prom-client';
import {
  MemoryResequencerStore,
  ResequencerService,
  SEQUENCE_METRICS_REGISTRY,
  SequenceModule,
  type ResequencerStore,
} from 'nest-sequence';
import { metricValue } from '../../test/support/sequence-test-app';

/** The memory store, whose gap statistics can be made to fail. */
class FlakyGapStatsStore extends MemoryResequencerStore {
  failing = false;

  override gapStats(scope: string, now: number) {
    if (this.failing) return Promise.reject(new Error('store unreachable'));
    return super.gapStats(scope, now);
  }
}

describe('resequencer gap gauges', () => {
  let app: INestApplicationContext | undefined;

  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  async function start(store: ResequencerStore): Promise<{
    registry: Registry;
    resequencers: ResequencerService;
  }> {
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          resequencer: { store },
          tuning: { sweepers: { gaps: { intervalMs: false }, expiry: { intervalMs: false } } },
        }),
      ],
    }).compile();
    moduleRef.useLogger(false);
    app = await moduleRef.init();
    return {
      registry: app.get(SEQUENCE_METRICS_REGISTRY),
      resequencers: app.get(ResequencerService),
    };
  }

  function event(key: string, seq: number) {
    return {
      body: Buffer.from(`${key}-${seq}`),
      headers: { 'x-resequence-key': key, 'x-resequence-seq': seq },
    };
  }

  it('reports each resequencer’s open gaps and the age of its oldest, read from the store', async () => {
    const { registry, resequencers } = await start(new MemoryResequencerStore());
    const gap = { timeoutMs: 60_000, policy: 'alert' as const };
    const orders = resequencers.create({ channel: 'orders', gap }, () => undefined);
    const payments = resequencers.create({ channel: 'payments', gap }, () => undefined);
    const opened = Date.now();
    // orders: two keys wait on a gap (2 and 3 arrived before 1); payments: in order, no gap.
    await orders.receive(event('A', 2));
    await orders.receive(event('B', 3));
    await orders.receive(event('C', 1));
    await payments.receive(event('A', 1));

    const openGaps = (resequencer: string) =>
      metricValue(registry, 'nest_sequence_resequencer_open_gaps', { resequencer });
    const oldestAge = (resequencer: string) =>
      metricValue(registry, 'nest_sequence_resequencer_oldest_gap_age_seconds', { resequencer });
    expect(await openGaps('orders')).toBe(2);
    expect(await openGaps('payments')).toBe(0);
    const age = await oldestAge('orders');
    expect(age).toBeGreaterThanOrEqual(0);
    expect(age).toBeLessThanOrEqual((Date.now() - opened) / 1000);
    expect(await oldestAge('payments')).toBe(0);

    // The gaps fill: the gauges follow at the next scrape (a second later: reads within one
    // second share the first).
    await orders.receive(event('A', 1));
    await orders.receive(event('B', 1));
    await orders.receive(event('B', 2));
    await new Promise((resolve) => setTimeout(resolve, 1_050));
    expect(await openGaps('orders')).toBe(0);
    expect(await oldestAge('orders')).toBe(0);
  });

  it('keeps the last values, counts the failed reads, and the scrape succeeds, while the store cannot answer', async () => {
    const store = new FlakyGapStatsStore();
    const { registry, resequencers } = await start(store);
    const orders = resequencers.create(
      { channel: 'orders', gap: { timeoutMs: 60_000, policy: 'alert' } },
      () => undefined,
    );
    await orders.receive(event('A', 2));
    expect(
      await metricValue(registry, 'nest_sequence_resequencer_open_gaps', { resequencer: 'orders' }),
    ).toBe(1);

    const failures = () =>
      metricValue(registry, 'nest_sequence_resequencer_stats_failures_total', {
        resequencer: 'orders',
      });
    expect(await failures()).toBe(0);

    store.failing = true;
    await orders.receive(event('B', 2));
    await new Promise((resolve) => setTimeout(resolve, 1_050));
    await expect(registry.metrics()).resolves.toContain('nest_sequence_resequencer_open_gaps');
    expect(
      await metricValue(registry, 'nest_sequence_resequencer_open_gaps', { resequencer: 'orders' }),
    ).toBe(1);
    // Frozen gauges alert on nothing: the failed reads are what shows the outage.
    expect(await failures()).toBe(1);
  });
});
